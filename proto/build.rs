//! Compiles the biopb tensor `.proto` files into Rust without a system `protoc`:
//! `protox` (pure Rust) parses them into a descriptor set, which `prost-build`
//! turns into code in `OUT_DIR`.

use std::error::Error;

/// The protocol files, relative to the include root `proto/`.
const PROTO_FILES: [&str; 4] = [
    "biopb/tensor/descriptor.proto",
    "biopb/tensor/ticket.proto",
    "biopb/tensor/serialized.proto",
    "biopb/image/annotation.proto",
];

/// Include root holding the `biopb/tensor/` and `biopb/image/` trees.
const INCLUDE_ROOT: &str = "proto";

fn main() -> Result<(), Box<dyn Error>> {
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={INCLUDE_ROOT}/{file}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    // protox resolves `google/protobuf/field_mask.proto` from its bundled
    // well-known types; prost maps FieldMask to `::prost_types::FieldMask`.
    let descriptor_set = protox::compile(PROTO_FILES, [INCLUDE_ROOT])?;
    prost_build::Config::new().compile_fds(descriptor_set)?;
    Ok(())
}
