# Sessions server image: non-root user, data on a volume, gRPC health check.
FROM python:3.11-slim

RUN useradd --create-home --uid 10001 sessions
WORKDIR /app
COPY pyproject.toml README.md ./
COPY server ./server
COPY clients/python ./clients/python
RUN pip install --no-cache-dir . \
    && mkdir -p /data && chown sessions:sessions /data

USER sessions
VOLUME ["/data"]
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import grpc,sys;from grpc_health.v1 import health_pb2 as h,health_pb2_grpc as g;c=grpc.insecure_channel('127.0.0.1:50051');sys.exit(0 if g.HealthStub(c).Check(h.HealthCheckRequest(),timeout=2).status==1 else 1)"]
ENTRYPOINT ["sessions-server", "serve", "--data-dir", "/data"]
CMD ["--listen", "0.0.0.0:50051"]
