//! The wire contract: generated types and tonic stubs for `sundial.v1`, plus the encoded
//! descriptor set that the server hands to gRPC reflection. Nothing here is hand-written
//! beyond the re-exports and the codec the stubs use; edit the `.proto` files instead.

/// `sundial.v1`: jobs, runs, the executor stream, nodes and apps.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("sundial.v1");
    include!(concat!(env!("OUT_DIR"), "/sundial.v1.serde.rs"));
}

/// The encoded `FileDescriptorSet` of every `sundial.v1` file and its imports.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sundial_descriptor.bin"));

/// The codec every generated client and server uses: prost's, with 1 KiB codec buffers
/// instead of tonic's 8 KiB. Tonic allocates an encode and a decode buffer per call up
/// front, and an executor's stream is one call that lives as long as the executor: a
/// server with a thousand idle executors held 16 MiB of buffers that heartbeats never
/// filled. A buffer still grows to any message that needs more.
pub mod codec {
    use tonic::codec::{BufferSettings, Codec};
    use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

    /// Bytes each call's encode and decode buffer start with (and grow by).
    pub const BUFFER_BYTES: usize = 1024;
    /// Tonic's own default: how much a stream's encoder batches before it yields.
    const YIELD_THRESHOLD: usize = 32 * 1024;

    /// [`ProstCodec`] with [`BUFFER_BYTES`] buffers.
    #[derive(Debug, Clone)]
    pub struct LeanCodec<T, U>(std::marker::PhantomData<(T, U)>);

    impl<T, U> Default for LeanCodec<T, U> {
        fn default() -> Self {
            Self(std::marker::PhantomData)
        }
    }

    fn settings() -> BufferSettings {
        BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
    }

    impl<T, U> Codec for LeanCodec<T, U>
    where
        T: prost::Message + Send + 'static,
        U: prost::Message + Default + Send + 'static,
    {
        type Encode = T;
        type Decode = U;
        type Encoder = ProstEncoder<T>;
        type Decoder = ProstDecoder<U>;

        fn encoder(&mut self) -> Self::Encoder {
            ProstCodec::<T, U>::raw_encoder(settings())
        }

        fn decoder(&mut self) -> Self::Decoder {
            ProstCodec::<T, U>::raw_decoder(settings())
        }
    }
}
