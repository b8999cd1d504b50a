# syntax=docker/dockerfile:1
# The ckptlab backend: REST API + frontend. No torch: the backend never imports it.
#
#   docker build -f docker/backend.Dockerfile -t ckptlab-backend .
#   docker run --rm -p 127.0.0.1:8000:8000 -v ckptlab-data:/data ckptlab-backend
#
# Usually built and run by docker-compose.yml at the repository root.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CKPTLAB_DATA_DIR=/data

# The same uid/gid as docker/worker.Dockerfile: both write the SQLite file on the shared
# volume. A fresh named volume takes the owner of /data from the first image mounting it.
RUN groupadd --system --gid 10001 ckptlab \
 && useradd --system --uid 10001 --gid ckptlab --create-home --home-dir /home/ckptlab ckptlab \
 && mkdir -p /data \
 && chown ckptlab:ckptlab /data

WORKDIR /src
COPY pyproject.toml README.md ./
COPY ckptlab ./ckptlab
COPY backend ./backend
COPY frontend ./frontend
COPY worker ./worker
COPY cli ./cli
# Not editable: the packages (and the frontend's files) land in site-packages.
RUN pip install ".[postgres]"

USER 10001:10001
WORKDIR /home/ckptlab
EXPOSE 8000

ENTRYPOINT ["ckptlab"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
