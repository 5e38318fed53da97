//! The control-message decoder (`wire::cmsg::Decoder`) and `decode_recv`,
//! on any bytes the kernel could leave in `msg_control`.
//!
//! Input: the control buffer itself.
//!
//! Checks: no panic or out-of-bounds read; every message's data lies in the
//! buffer; an error ends the walk and is what `decode_recv` returns; the
//! messages read, encoded again with `Encoder`, decode to the same messages
//! and the same `RecvControl`.

#![no_main]

use fastudp_tools::wire::cmsg::{self, CmsgError, Decoder, Encoder};
use fastudp_tools::wire::control::decode_recv;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut msgs = Vec::new();
    let mut error = None;
    for m in Decoder::new(data) {
        assert!(error.is_none(), "the walk goes on after an error");
        match m {
            Ok(c) => {
                assert!(cmsg::HEADER + c.data.len() <= data.len());
                msgs.push(c);
            }
            Err(e) => {
                assert!(matches!(e, CmsgError::BadLength { .. }), "{e:?}");
                error = Some(e);
            }
        }
    }
    let got = decode_recv(data);
    assert_eq!(got.err(), error);
    if let Ok(r) = got {
        assert!(r.stride.is_none_or(|s| s > 0), "a zero stride: {r:?}");
        assert!(r.ecn.is_none() || r.tos_seen);
    }

    let room: usize = msgs.iter().map(|c| cmsg::space(c.data.len())).sum();
    let mut buf = vec![0u8; room];
    let mut enc = Encoder::new(&mut buf);
    for c in &msgs {
        enc.push(c.level, c.ty, c.data)
            .expect("room for every message");
    }
    assert_eq!(enc.len(), room);
    let again: Vec<_> = Decoder::new(&buf)
        .collect::<Result<_, _>>()
        .expect("what the encoder wrote decodes");
    assert_eq!(again, msgs);
    if let Ok(r) = got {
        assert_eq!(decode_recv(&buf), Ok(r));
    }
});
