# labkit's training image: labkit with one framework, built to use the GPU on Vertex AI.
# Build it with `labkit image` (Cloud Build; see cloudbuild.yaml), or locally:
#   docker build --build-arg FRAMEWORK=torch -t labkit-torch .
# FRAMEWORK is "torch" or "tf". `labkit image` tags the image with a digest of everything copied
# into it (labkit.vertex.images.image_tag), so edited code never runs in an old image.
#
# The GPU: Vertex AI mounts the NVIDIA driver under /usr/local/nvidia and does not put it on the
# loader's path; NVIDIA's CUDA images (and Deep Learning Containers) do, which is why the training
# page says to start from one (https://docs.cloud.google.com/gemini-enterprise-agent-platform/
# machine-learning/training/code-requirements#gpus, read 2026-11-26). The path is set again below
# so that no later base change can lose it. amd64 only: A4X machines (Arm) need another image.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM --platform=linux/amd64 ${CUDA_IMAGE}

ARG FRAMEWORK=torch
# A CUDA build of each framework, at or above pyproject.toml's minimums (torch>=2.6,
# tensorflow>=2.16 with Keras 3): torch from PyTorch's CUDA 12.8 wheel index (Blackwell GPUs
# need CUDA 12.8), TensorFlow with its CUDA libraries ("and-cuda").
ARG TORCH_VERSION=2.7.1
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TENSORFLOW_VERSION=2.20.0
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib:${LD_LIBRARY_PATH} \
    PATH=/opt/venv/bin:/usr/local/nvidia/bin:${PATH}

# Python, and Google's Reduction Server NCCL plugin: a job with a Reduction Server pool needs
# `google-reduction-server` in its training image (the distributed-training page, read
# 2026-11-26); it is idle in jobs without one.
RUN apt-get update && \
    apt-get install -y --no-install-recommends python3 python3-venv python3-dev curl gnupg ca-certificates && \
    curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | \
      gpg --dearmor -o /usr/share/keyrings/google-fast-socket.gpg && \
    echo "deb [signed-by=/usr/share/keyrings/google-fast-socket.gpg] https://packages.cloud.google.com/apt google-fast-socket main" \
      > /etc/apt/sources.list.d/google-fast-socket.list && \
    apt-get update && apt-get install -y --no-install-recommends google-reduction-server && \
    rm -rf /var/lib/apt/lists/* && \
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
