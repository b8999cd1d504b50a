# syntax=docker/dockerfile:1
# The ckptlab worker: claims queued experiments and runs them with PyTorch.
#
# A CUDA build of torch by default; the wheels bring the CUDA runtime, the host brings the
# NVIDIA driver (through the NVIDIA Container Toolkit). Other builds:
#   docker build -f docker/worker.Dockerfile \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu -t ckptlab-worker .
#   docker build -f docker/worker.Dockerfile --build-arg TORCH_SPEC="torch==2.13.0" \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 -t ckptlab-worker .
#
# Usually built and run by docker-compose.yml at the repository root.
FROM python:3.11-slim

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cu128"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CKPTLAB_DATA_DIR=/data \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# The same uid/gid as docker/backend.Dockerfile: both write the SQLite file on the shared
# volume.
RUN groupadd --system --gid 10001 ckptlab \
 && useradd --system --uid 10001 --gid ckptlab --create-home --home-dir /home/ckptlab ckptlab \
 && mkdir -p /data \
 && chown ckptlab:ckptlab /data

# torch first, in its own layer (gigabytes; cached while only the source changes). The
# worker extra's "torch>=2.4" is then already satisfied, so pip pulls no second torch.
RUN pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY ckptlab ./ckptlab
COPY backend ./backend
COPY frontend ./frontend
COPY worker ./worker
COPY cli ./cli
RUN pip install ".[worker,postgres]"

USER 10001:10001
WORKDIR /home/ckptlab

ENTRYPOINT ["ckptlab"]
CMD ["worker"]
