//! Entry points for the fuzzers (`fuzz/`): every parser that reads bytes from a peer during
//! set-up, on arbitrary bytes. Not API: hidden from the docs, and may change at any time.

use std::io::Cursor;

use crate::error::CclError;

/// The bootstrap: a registration as the root reads it, the table as a rank reads it, and a
/// mesh hello.
pub fn bootstrap(bytes: &[u8]) {
    let _ = crate::bootstrap::read_registration(&mut Cursor::new(bytes));
    let n = bytes.first().map_or(0, |&b| usize::from(b));
    let io = |e: std::io::Error| CclError::bootstrap(e.to_string());
    let _ = crate::bootstrap::read_table(&mut Cursor::new(bytes), n, &io);
    let _ = crate::bootstrap::read_hello(&mut Cursor::new(bytes));
}

/// The transports' set-up: a handshake message, then each of its fields as a shared-memory
/// segment name and as an RDMA offer.
pub fn transport_setup(bytes: &[u8]) {
    if let Ok((_, fields)) = monel_peer::channel::recv_msg(&mut Cursor::new(bytes)) {
        for f in &fields {
            let _ = crate::transport::segment::valid_name(f);
            let _ = crate::transport::rdma::Offer::decode(f);
        }
    }
    let _ = crate::transport::rdma::Offer::decode(bytes);
}

/// A frame header, as every link's receiver decodes it.
pub fn frame(bytes: &[u8]) {
    if let Some(b) = bytes.get(..crate::frame::HEADER_LEN) {
        let _ = crate::frame::Header::decode(b.try_into().expect("header length"));
    }
}
