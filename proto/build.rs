//! Compiles `sundial/v1/*.proto` with protox (no system `protoc`) into tonic stubs,
//! serde implementations in the canonical JSON mapping (pbjson), and the encoded
//! descriptor set (with imports) that reflection serves.

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &[
    "sundial/v1/job.proto",
    "sundial/v1/run.proto",
    "sundial/v1/executor.proto",
    "sundial/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(PROTOS, ["."])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let encoded = fds.encode_to_vec();
    fs::write(out.join("sundial_descriptor.bin"), &encoded)?;
    // serde for every message, in the proto's canonical JSON mapping (lowerCamelCase
    // out, both spellings in), for the REST edge.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .build(&[".sundial.v1"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // `ExecutorService.Connect` would collide with the generated `connect` constructor;
        // clients are built with `new(channel)` instead.
        .build_transport(false)
        .codec_path("crate::codec::LeanCodec")
        .compile_fds(fds)?;
    Ok(())
}
