# Sessions server image: a wheel built in a throw-away stage, installed into a slim runtime with a
# non-root user, the data directory on a volume, and a health check on the gRPC health service.
#
#   docker build -t sessions:0.1.0 .
#   docker run -p 50051:50051 -v sessions-data:/data sessions:0.1.0
#
# The default command listens in plaintext on 0.0.0.0:50051 (--allow-plaintext: inside a trusted
# network or behind a TLS-terminating proxy). For TLS, mount a certificate and replace the command:
#   docker run -v /etc/sessions/tls:/tls:ro ... sessions:0.1.0 \
#       --listen 0.0.0.0:50051 --tls-cert /tls/server.crt --tls-key /tls/server.key \
#       [--tls-client-ca /tls/clients-ca.crt]
# The HEALTHCHECK below asks the probe port (--probe-listen, health alone, plaintext, inside the
# container only), so it works whatever the main port speaks; with --tokens-file, health on the
# main port then needs a token.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY clients/python ./clients/python
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --gid 10001 sessions \
    && useradd --create-home --uid 10001 --gid 10001 sessions \
    && mkdir -p /data \
    && chown sessions:sessions /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels

USER 10001:10001
WORKDIR /home/sessions
VOLUME ["/data"]
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; c = grpc.insecure_channel('127.0.0.1:50052'); sys.exit(0 if g.HealthStub(c).Check(h.HealthCheckRequest(), timeout=2).status == h.HealthCheckResponse.SERVING else 1)"]
ENTRYPOINT ["sessions-server", "serve", "--data-dir", "/data", "--probe-listen", "127.0.0.1:50052"]
CMD ["--listen", "0.0.0.0:50051", "--allow-plaintext"]
