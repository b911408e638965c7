# faultlens: one image for the node agent, the attribution service, the decider and Jupyter.
#   docker build -t faultlens:0.1.0 .                              # agent, attribution, notebooks
#   docker build -t faultlens:0.1.0-torch --build-arg TORCH=1 .     # + the CPU build of torch (demo, run)
FROM python:3.11.11-slim-bookworm

ARG EXTRAS=s3,notebooks,lab
ARG TORCH=0
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY faultlens/ faultlens/
COPY collectors/ collectors/
COPY attribution/ attribution/
COPY controller/ controller/
COPY rules/ rules/
# a plain (non-editable) install: one package, faultlens, with the rules as package data
RUN pip install -U pip && pip install ".[${EXTRAS}]" \
    && if [ "${TORCH}" = "1" ]; then \
         pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; \
       fi

COPY notebooks/ notebooks/
COPY docs/deploy/ docs/deploy/

# the agent reads /dev/kmsg and NVML (both granted by the runtime, see docker-compose.yml); no root needed for the
# attribution service or Jupyter, which docker-compose.yml runs as this user
RUN useradd --create-home --uid 10001 faultlens \
    && mkdir -p /var/spool/faultlens/decisions && chown -R faultlens /var/spool/faultlens
ENTRYPOINT []
CMD ["faultlens", "--help"]
