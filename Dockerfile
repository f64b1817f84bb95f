# RLGuard image: server, workers and the node agent (one image, the command picks the role).
#
#   docker build -t rlguard .
#   docker run --rm rlguard rlguard --help
#
# torch is the CPU wheel from PyTorch's own index: the control plane never needs CUDA kernels
# (the agent reads GPUs through NVML, which comes from the host driver via the NVIDIA runtime).
FROM python:3.11-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/rlguard
ENV PATH=/opt/rlguard/bin:$PATH
# torch first and alone: it is the big layer and changes least often.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
# The source stays at /opt/rlguard/src and is installed editable: the dashboard finds its Jinja
# templates beside the package (templates/ at the project root), which a wheel does not carry.
WORKDIR /opt/rlguard/src
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY agents ./agents
COPY recovery ./recovery
COPY workload ./workload
COPY migrations ./migrations
COPY templates ./templates
RUN pip install -e . && rm -rf /root/.cache

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/rlguard/bin:$PATH \
    RLGUARD_DATA_DIR=/var/lib/rlguard \
    RLGUARD_HOST=0.0.0.0 RLGUARD_PORT=8000
RUN groupadd --system --gid 10001 rlguard \
 && useradd --system --uid 10001 --gid rlguard --home-dir /var/lib/rlguard --create-home \
      --shell /usr/sbin/nologin rlguard
COPY --from=build /opt/rlguard /opt/rlguard
WORKDIR /var/lib/rlguard
USER rlguard:rlguard
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=5 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('RLGUARD_PORT', '8000'), timeout=3)"]
CMD ["rlguard", "server"]
