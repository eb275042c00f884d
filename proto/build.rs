//! Compiles `k3/v1/k3.proto` with protox (pure Rust), so no `protoc` binary is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = "k3/v1/k3.proto";
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([file], ["."])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
