# autocdc in a container: `docker compose up autocdc` (see docker-compose.yml).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release --locked --bin autocdc

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/autocdc /usr/local/bin/autocdc
# ./warehouse and ./autocdc-data (the defaults) live here; mount a volume on it.
WORKDIR /var/lib/autocdc
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/autocdc"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
