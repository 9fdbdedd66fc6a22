# wal2iceberg, built from this repository with the release build command
# README.md gives; compose.yaml runs it next to PostgreSQL 17.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
COPY tests ./tests
RUN cargo build --release --locked --bin wal2iceberg

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/wal2iceberg /usr/local/bin/wal2iceberg
RUN mkdir /lake && chown nobody /lake
USER nobody
ENTRYPOINT ["wal2iceberg"]
