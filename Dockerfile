# Multi-stage build: a static-ish release binary on a distroless base.
#   docker build -t trellis:dev .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin trellis

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/trellis /usr/local/bin/trellis
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/trellis"]
CMD ["run", "--rules=/etc/trellis/rules"]
