//! The wire contract: generated types and tonic stubs for `sundial.v1`, plus the encoded
//! descriptor set that the server hands to gRPC reflection. Nothing here is hand-written
//! beyond the re-exports; edit the `.proto` files instead.

/// `sundial.v1`: jobs, runs, the executor stream, nodes and apps.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("sundial.v1");
    include!(concat!(env!("OUT_DIR"), "/sundial.v1.serde.rs"));
}

/// The encoded `FileDescriptorSet` of every `sundial.v1` file and its imports.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sundial_descriptor.bin"));
