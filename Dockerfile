# labkit's training image: labkit with one framework, built to use the GPU on Vertex AI.
# Build it with `labkit image` (Cloud Build; see cloudbuild.yaml), or locally:
#   docker build --build-arg FRAMEWORK=torch -t labkit-torch .
# FRAMEWORK is "torch" or "tf". `labkit image` tags the image with a digest of everything copied
# into it (labkit.vertex.images.image_tag), so edited code never runs in an old image.
#
# One copy of each CUDA library. The framework's wheels bring CUDA and cuDNN (torch's nvidia-*
# packages, tensorflow[and-cuda]), so the base is plain Ubuntu: an nvidia/cuda *-cudnn-runtime base
# would carry the same libraries a second time. What an NVIDIA CUDA base adds for the GPU is made
# here as its Dockerfile makes it (https://gitlab.com/nvidia/container-images/cuda, base image,
# read 2026-11-29): Vertex AI mounts the NVIDIA driver under /usr/local/nvidia and does not put it
# on the loader's path, which is why the training page says to start from a CUDA or Deep Learning
# Containers image (https://docs.cloud.google.com/gemini-enterprise-agent-platform/
# machine-learning/training/code-requirements#gpus, read 2026-11-26); so /usr/local/nvidia/lib64
# goes into the loader's configuration and LD_LIBRARY_PATH, its bin/ onto PATH, and the
# nvidia-container-runtime variables are set. amd64 only: A4X machines (Arm) need another image.
ARG BASE_IMAGE=ubuntu:24.04
FROM --platform=linux/amd64 ${BASE_IMAGE}

ARG FRAMEWORK=torch
# A CUDA build of each framework, at or above pyproject.toml's minimums (torch>=2.6,
# tensorflow>=2.16 with Keras 3): torch from PyTorch's CUDA 12.8 wheel index (Blackwell GPUs
# need CUDA 12.8; these wheels have no kernels for Pascal or Volta, and labkit refuses P4, P100
# and V100 on this image: labkit.vertex.images.check_image_gpu), or `labkit image --torch-cuda
# cu126` (TORCH_INDEX=.../cu126: Maxwell to Hopper). TensorFlow with its CUDA libraries.
ARG TORCH_VERSION=2.7.1
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TENSORFLOW_VERSION=2.20.0
# /opt/google-reduction-server/lib holds the Reduction Server plugin (below): only LD_LIBRARY_PATH
# names it, and a multi-node job on a GPUDirect-RDMA machine drops it (labkit.vertex.nccl).
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64:/opt/google-reduction-server/lib \
    PATH=/opt/venv/bin:/usr/local/nvidia/bin:${PATH}

# Python; libibverbs (libibverbs1, and ibverbs-providers with the mlx5 driver of the RDMA NICs),
# which Google's gIB NCCL plugin on A3 Ultra / A4 machines needs and NCCL opens as
# libibverbs.so.1; and Google's Reduction Server NCCL plugin: a job with a Reduction Server pool
# needs `google-reduction-server` in its training image (the distributed-training page, read
# 2026-11-26). Its libnccl-net*.so moves out of the system library folders, so that on GPUDirect-
# RDMA machines, where Google's NCCL/gIB page says not to install FastSocket-family plugins
# (https://docs.cloud.google.com/ai-hypercomputer/docs/nccl/test-vms, read 2026-11-29), only gIB's
# plugin is on the loader path. curl and gnupg fetch the repository's key and leave in the same
# layer; nothing is compiled, so no compiler or python3-dev is installed (every dependency has a
# wheel: benchmarks/image_size.py resolves the image with --only-binary=:all:).
RUN apt-get update && \
    apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
        libibverbs1 ibverbs-providers curl gnupg && \
    echo /usr/local/nvidia/lib > /etc/ld.so.conf.d/nvidia.conf && \
    echo /usr/local/nvidia/lib64 >> /etc/ld.so.conf.d/nvidia.conf && \
    curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | \
      gpg --dearmor -o /usr/share/keyrings/google-fast-socket.gpg && \
    echo "deb [signed-by=/usr/share/keyrings/google-fast-socket.gpg] https://packages.cloud.google.com/apt google-fast-socket main" \
      > /etc/apt/sources.list.d/google-fast-socket.list && \
    apt-get update && apt-get install -y --no-install-recommends google-reduction-server && \
    plugins="$(dpkg -L google-reduction-server | grep -E '/libnccl-net[^/]*\.so[^/]*$' || true)" && \
    if [ -z "$plugins" ]; then echo "google-reduction-server installed no libnccl-net*.so" >&2; exit 1; fi && \
    mkdir -p /opt/google-reduction-server/lib && mv $plugins /opt/google-reduction-server/lib/ && \
    apt-mark auto curl gnupg && apt-get autoremove --purge -y && \
    rm -rf /var/lib/apt/lists/* /etc/apt/sources.list.d/google-fast-socket.list && \
    ldconfig && \
    python3 -m venv /opt/venv

WORKDIR /opt/labkit
COPY pyproject.toml README.md LICENSE ./
COPY labkit ./labkit

# The framework first, pinned to its CUDA build; then labkit with its extras, which keep it.
# The build fails if the framework that ends up installed has no CUDA support.
RUN case "$FRAMEWORK" in \
      torch) pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}" && \
             pip install ".[torch,vertex,data,tune]" && \
             python -c "import torch; assert torch.version.cuda, 'torch has no CUDA'; print('torch', torch.__version__, 'CUDA', torch.version.cuda)" ;; \
      tf) pip install "tensorflow[and-cuda]==${TENSORFLOW_VERSION}" && \
          pip install ".[tf,vertex,data,tune]" && \
          python -c "import tensorflow as tf; assert tf.test.is_built_with_cuda(), 'TensorFlow has no CUDA'; print('tensorflow', tf.__version__)" ;; \
      *) echo "FRAMEWORK must be torch or tf (got $FRAMEWORK)" >&2; exit 2 ;; \
    esac && \
    python -m labkit --version

WORKDIR /workspace
ENTRYPOINT []
CMD ["python", "-m", "labkit", "doctor"]
