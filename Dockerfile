# Multi-stage build: a release binary on a distroless base.
#   docker build -t trellis:dev .
# The build stage copies exactly what `cargo build --locked` reads: the
# manifest and lockfile, the sources (the binary crate's and the core
# crate's in crates/), the bench targets Cargo.toml declares and the
# patched minijinja in vendor/ ([patch.crates-io]). .dockerignore
# keeps everything else (target/, .git, fuzz/, ...) out of the context;
# tests/docker.rs replays these COPY lines into an empty directory and
# resolves the build there offline, so a missing file fails `cargo test`.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
COPY vendor ./vendor
RUN cargo build --release --locked --bin trellis

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/trellis /usr/local/bin/trellis
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/trellis"]
CMD ["run", "--rules=/etc/trellis/rules"]
