# labkit's training image: labkit with one framework, at the versions pyproject.toml requires.
# Build it with `labkit image` (Cloud Build; see cloudbuild.yaml), or locally:
#   docker build --build-arg FRAMEWORK=torch -t labkit-torch .
# FRAMEWORK is "torch" or "tf". The framework wheels bring their own CUDA libraries, so a slim
# Python base serves both CPU and GPU machines (Vertex provides the NVIDIA driver).
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ARG FRAMEWORK=torch
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/labkit
COPY pyproject.toml README.md LICENSE ./
COPY labkit ./labkit

# labkit and its framework extra (pyproject's minimums), the Vertex extra (gcsfs, aiplatform)
# and the tuning extra. TensorFlow's GPU build needs its CUDA packages ("and-cuda"), pinned to
# the TensorFlow version just installed.
RUN case "$FRAMEWORK" in \
      torch) pip install ".[torch,vertex,tune]" ;; \
      tf) pip install ".[tf,vertex,tune]" && \
          pip install "tensorflow[and-cuda]==$(python -c 'import tensorflow as tf; print(tf.__version__)')" ;; \
      *) echo "FRAMEWORK must be torch or tf (got $FRAMEWORK)" >&2; exit 2 ;; \
    esac && \
    python -m labkit --version

WORKDIR /workspace
ENTRYPOINT []
CMD ["python", "-m", "labkit", "doctor"]
