# Builds both belfry binaries; docker-compose.yml runs them.
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin belfry-scheduler --bin belfry-worker --bin belfry

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/belfry-scheduler /src/target/release/belfry-worker /src/target/release/belfry /usr/local/bin/
COPY examples/schedules.toml /etc/belfry/schedules.toml
ENV BELFRY_SCHEDULES=/etc/belfry/schedules.toml
# A numeric user, so Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
