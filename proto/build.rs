//! Compiles `k3/v1/k3.proto` with protox (pure Rust), so no `protoc` binary is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = "k3/v1/k3.proto";
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([file], ["."])?;
    // Serialize on every message, so the client's `--json` output is derived from the schema
    // and cannot drift from it.
    tonic_prost_build::configure()
        .type_attribute(".k3.v1", "#[derive(serde::Serialize)]")
        // prost's codec, but a request that does not decode is INVALID_ARGUMENT (src/codec.rs).
        .codec_path("crate::codec::Codec")
        .compile_fds(descriptors)?;
    Ok(())
}
