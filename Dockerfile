# autocdc in a container (docker-compose.yml, docs/docker.md).
#   docker build -t autocdc:latest .        # from source: the last stage, the default
#   docker build --target runtime-prebuilt -t autocdc:latest DIR
#                                           # from a binary built elsewhere: DIR holds
#                                           # only `autocdc` (built on Debian bookworm)

# What every runtime image has: TLS roots (S3, REST catalogs) and an
# unprivileged user who owns the data directory.
FROM debian:bookworm-slim AS base
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 autocdc \
    && useradd --uid 10001 --gid autocdc --home-dir /var/lib/autocdc \
        --shell /usr/sbin/nologin autocdc \
    && install -d -o autocdc -g autocdc /var/lib/autocdc
# ./warehouse and ./autocdc-data (the defaults) live here. A new volume
# mounted on it takes this directory's owner.
WORKDIR /var/lib/autocdc
VOLUME /var/lib/autocdc
USER autocdc
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/autocdc"]
CMD ["serve", "--listen", "0.0.0.0:8080"]

# The runtime from a prebuilt binary, no compiler (CI packs the one its tests
# ran). It comes before the compiling stages because the legacy builder
# (Debian's docker.io) builds every stage above its target; it builds this
# one in a source build too, where the context has no `autocdc`: the
# `.dockerignore*` there keeps the COPY from matching nothing (an error).
FROM base AS runtime-prebuilt
COPY autocdc* .dockerignore* /usr/local/bin/

FROM rust:1-bookworm AS build
WORKDIR /src
ENV CARGO_PROFILE_RELEASE_STRIP=symbols
# The dependencies alone first, under a placeholder crate, so that a change
# under src/ rebuilds autocdc and not every crate it uses.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked --bin autocdc \
    && rm -rf src
COPY src ./src
# The copied sources keep their own times, which may be older than the
# placeholder's build: touch the crate roots so that cargo rebuilds them.
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin autocdc

FROM base AS runtime
COPY --from=build /src/target/release/autocdc /usr/local/bin/autocdc
