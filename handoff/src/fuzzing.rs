//! Fuzz entry point of the socket image decoders, shared by the cargo-fuzz target
//! `fuzz/fuzz_targets/image_decode.rs` and the stable smoke test
//! `tests/fuzz_smoke.rs`. Not part of the crate's API (`#[doc(hidden)]`).

use crate::image::SocketImage;

/// `SocketImage::from_bytes` (binary) and the serde form (JSON) on the same bytes:
/// no panic, bounded allocation, and whatever decodes survives a round trip.
pub fn image_decode(data: &[u8]) {
    if let Ok(img) = SocketImage::from_bytes(data) {
        // from_bytes validates; what it returns encodes and decodes to itself.
        let bytes = img.to_bytes();
        match SocketImage::from_bytes(&bytes) {
            Ok(back) => assert!(back == img, "binary round trip changed the image"),
            Err(e) => panic!("a decoded image does not decode after encoding: {e}"),
        }
        let _ = (img.queued_bytes(), img.snd_nxt(), img.rcv_nxt());
    }
    if let Ok(img) = serde_json::from_slice::<SocketImage>(data) {
        // The serde form does not validate by itself; restore does, first.
        if img.validate().is_ok() {
            let bytes = img.to_bytes();
            if let Err(e) = SocketImage::from_bytes(&bytes) {
                panic!("a valid JSON image does not survive the binary form: {e}");
            }
        }
        let json = serde_json::to_vec(&img).expect("images serialize");
        if let Err(e) = serde_json::from_slice::<SocketImage>(&json) {
            panic!("a JSON image does not decode after encoding: {e}");
        }
    }
}
