//! Classic BPF programs that steer datagrams among a reuseport group
//! (`SO_ATTACH_REUSEPORT_CBPF`), and a small interpreter to test them.
//!
//! For UDP the program sees the datagram's payload at offset 0 and returns
//! the index of the socket, in the order the sockets joined the group.

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Opcode.
    pub code: u16,
    /// Jump if true.
    pub jt: u8,
    /// Jump if false.
    pub jf: u8,
    /// Constant.
    pub k: u32,
}

/// `BPF_LD | BPF_W | BPF_ABS`: A = 32-bit big-endian word at offset k.
pub const LD_W_ABS: u16 = 0x20; // BPF_LD (0x00) | BPF_W (0x00) | BPF_ABS (0x20)
/// `BPF_LD | BPF_B | BPF_ABS`: A = the byte at offset k.
pub const LD_B_ABS: u16 = 0x30; // BPF_LD (0x00) | BPF_B (0x10) | BPF_ABS (0x20)
/// `BPF_JMP | BPF_JSET | BPF_K`: skip jt instructions if A & k, else jf.
pub const JSET_K: u16 = 0x45; // BPF_JMP (0x05) | BPF_JSET (0x40) | BPF_K (0x00)
/// `BPF_JMP | BPF_JA`: skip k instructions.
pub const JA: u16 = 0x05; // BPF_JMP (0x05) | BPF_JA (0x00)
/// `BPF_ALU | BPF_MOD | BPF_K`: A %= k.
pub const ALU_MOD_K: u16 = 0x94; // BPF_ALU (0x04) | BPF_MOD (0x90) | BPF_K (0x00)
/// `BPF_RET | BPF_A`: return A.
pub const RET_A: u16 = 0x16; // BPF_RET (0x06) | BPF_A (0x10)
/// `SKF_AD_OFF + SKF_AD_CPU`: loading here gives the current CPU.
pub const AD_CPU: u32 = 0xFFFF_F000_u32.wrapping_add(36);

/// `A = load(k); A %= n; return A`: the shape of every program here.
fn load_mod(k: u32, n: u32) -> Vec<Insn> {
    vec![
        Insn {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k,
        },
        Insn {
            code: ALU_MOD_K,
            jt: 0,
            jf: 0,
            k: n.max(1),
        },
        Insn {
            code: RET_A,
            jt: 0,
            jf: 0,
            k: 0,
        },
    ]
}

/// Steers by the CPU that received the datagram: socket `cpu % n`.
pub fn by_cpu(n: u32) -> Vec<Insn> {
    load_mod(AD_CPU, n)
}

/// Steers by 4 payload bytes at `offset` (such as part of a QUIC
/// connection ID), read big-endian: socket `word % n`. The same bytes
/// always land on the same socket. A datagram too short to hold them goes
/// to socket 0.
pub fn by_payload(offset: u32, n: u32) -> Vec<Insn> {
    load_mod(offset, n)
}

/// Offset of the destination connection ID in a QUIC long-header packet
/// (RFC 9000 17.2: 1 byte of flags, 4 of version, 1 of DCID length).
pub const QUIC_LONG_DCID: u32 = 6;
/// Offset of the destination connection ID in a QUIC short-header packet
/// (RFC 9000 17.3: 1 byte of flags).
pub const QUIC_SHORT_DCID: u32 = 1;

/// Steers QUIC packets by the first byte of their destination connection
/// ID: socket `byte % n`. Byte 0's header-form bit (0x80) tells a long
/// header (DCID at offset 6) from a short one (DCID at offset 1). A server
/// whose connection IDs start with a byte that is its worker's index
/// modulo `n` gets every packet of a connection on that worker's socket;
/// a client's first Initial (its own random DCID) lands on one fixed
/// socket too. A datagram too short goes to socket 0.
pub fn by_quic_cid(n: u32) -> Vec<Insn> {
    by_quic_cid_at(0, n)
}

/// The largest byte index [`by_quic_cid_at`] takes: QUIC version 1's
/// connection IDs are at most 20 bytes (RFC 9000 17.2).
pub const MAX_QUIC_CID_INDEX: u8 = 19;

/// Steers QUIC packets by byte `index` of their destination connection ID
/// (as [`by_quic_cid`], which is index 0): socket `byte % n`. A QUIC-LB
/// connection ID (draft-ietf-quic-load-balancers) carries a first octet
/// and a server ID before the nonce, so the worker's byte is the nonce's
/// first, at index `1 + server ID length`. A datagram too short for the
/// byte goes to socket 0.
pub fn by_quic_cid_at(index: u8, n: u32) -> Vec<Insn> {
    let i = |code, jt, jf, k| Insn { code, jt, jf, k };
    let at = u32::from(index);
    vec![
        i(LD_B_ABS, 0, 0, 0),
        i(JSET_K, 0, 2, 0x80),
        i(LD_B_ABS, 0, 0, QUIC_LONG_DCID + at),
        i(JA, 0, 0, 1),
        i(LD_B_ABS, 0, 0, QUIC_SHORT_DCID + at),
        i(ALU_MOD_K, 0, 0, n.max(1)),
        i(RET_A, 0, 0, 0),
    ]
}

/// The socket [`by_quic_cid`] picks for `datagram` among `n`, computed
/// directly (what the kernel's run of the program gives).
pub fn quic_cid_index(datagram: &[u8], n: u32) -> u32 {
    quic_cid_index_at(datagram, 0, n)
}

/// The socket [`by_quic_cid_at`] picks for `datagram` among `n` with byte
/// `index` of the destination connection ID, computed directly.
pub fn quic_cid_index_at(datagram: &[u8], index: u8, n: u32) -> u32 {
    let at = match datagram.first() {
        Some(b) if b & 0x80 != 0 => QUIC_LONG_DCID,
        Some(_) => QUIC_SHORT_DCID,
        None => return 0,
    } as usize
        + usize::from(index);
    match datagram.get(at) {
        Some(&b) => u32::from(b) % n.max(1),
        None => 0,
    }
}

/// Runs a program built of the instructions above on `payload` as the
/// kernel would, with `cpu` as the receiving CPU. An out-of-bounds load
/// ends the program with 0, as in the kernel. Jumps only go forward, so
/// the program ends.
#[cfg(any(test, feature = "tools"))]
pub fn run(prog: &[Insn], payload: &[u8], cpu: u32) -> Option<u32> {
    let mut a: u32 = 0;
    let mut pc = 0usize;
    while let Some(i) = prog.get(pc) {
        pc += 1;
        match i.code {
            LD_W_ABS if i.k == AD_CPU => a = cpu,
            LD_W_ABS => {
                let o = i.k as usize;
                match payload.get(o..o + 4) {
                    Some(b) => a = u32::from_be_bytes(b.try_into().ok()?),
                    None => return Some(0),
                }
            }
            LD_B_ABS => match payload.get(i.k as usize) {
                Some(&b) => a = u32::from(b),
                None => return Some(0),
            },
            JSET_K => pc += usize::from(if a & i.k != 0 { i.jt } else { i.jf }),
            JA => pc += i.k as usize,
            ALU_MOD_K => a = a.checked_rem(i.k)?,
            RET_A => return Some(a),
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn opcodes_are_the_kernels() {
        // Checked against the kernel's own definitions (linux/filter.h,
        // linux/bpf_common.h as libc carries them), not the literals the
        // constants were written from.
        assert_eq!(LD_W_ABS as u32, libc::BPF_LD | libc::BPF_W | libc::BPF_ABS);
        assert_eq!(
            ALU_MOD_K as u32,
            libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K
        );
        assert_eq!(RET_A as u32, libc::BPF_RET | libc::BPF_A);
        assert_eq!(LD_B_ABS as u32, libc::BPF_LD | libc::BPF_B | libc::BPF_ABS);
        assert_eq!(JSET_K as u32, libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K);
        assert_eq!(JA as u32, libc::BPF_JMP | libc::BPF_JA);
        assert_eq!(AD_CPU, (libc::SKF_AD_OFF + libc::SKF_AD_CPU) as u32);
    }

    #[test]
    fn cpu_and_short_payloads() {
        assert_eq!(run(&by_cpu(4), &[], 6), Some(2));
        assert_eq!(
            run(&by_payload(1, 4), &[0, 0, 0], 0),
            Some(0),
            "too short: socket 0"
        );
        assert_eq!(run(&by_payload(1, 4), &[9, 0, 0, 0, 7], 0), Some(3));
    }

    #[test]
    fn quic_cid_long_and_short_headers() {
        let p = by_quic_cid(4);
        // Long header (Initial): DCID length 8 at offset 5, DCID at 6.
        let long = [0xC3, 0, 0, 0, 1, 8, 0x0A, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(run(&p, &long, 0), Some(2));
        // Short header: DCID at 1.
        let short = [0x43, 0x07, 9, 9, 9];
        assert_eq!(run(&p, &short, 0), Some(3));
        assert_eq!(run(&p, &[0xC0, 0, 0], 0), Some(0), "too short: socket 0");
        assert_eq!(run(&p, &[], 0), Some(0));
    }

    #[test]
    fn quic_cid_byte_further_in() {
        // A QUIC-LB connection ID: first octet 0x29, server ID 0xAB 0xCD,
        // then the nonce, whose first byte (index 3) is the worker's.
        let p = by_quic_cid_at(3, 4);
        let long = [
            0xC3, 0, 0, 0, 1, 10, 0x29, 0xAB, 0xCD, 0x07, 9, 9, 9, 9, 9, 9,
        ];
        assert_eq!(run(&p, &long, 0), Some(3));
        let short = [0x43, 0x29, 0xAB, 0xCD, 0x06, 9, 9];
        assert_eq!(run(&p, &short, 0), Some(2));
        // Index 0 reads the first octet, as `by_quic_cid`.
        assert_eq!(run(&by_quic_cid_at(0, 4), &short, 0), Some(0x29 % 4));
        assert_eq!(by_quic_cid_at(0, 7), by_quic_cid(7));
        assert_eq!(
            run(&p, &[0x43, 0x29, 0xAB], 0),
            Some(0),
            "too short: socket 0"
        );
    }

    proptest! {
        /// The interpreter's run of the QUIC program and the direct
        /// computation agree on any datagram.
        #[test]
        fn quic_cid_index_matches_the_program(d in any::<Vec<u8>>(), n in 1u32..300) {
            prop_assert_eq!(run(&by_quic_cid(n), &d, 0), Some(quic_cid_index(&d, n)));
        }

        /// The same for a byte further into the connection ID.
        #[test]
        fn quic_cid_index_at_matches_the_program(
            d in any::<Vec<u8>>(), n in 1u32..300, index in 0u8..=MAX_QUIC_CID_INDEX,
        ) {
            prop_assert_eq!(
                run(&by_quic_cid_at(index, n), &d, 0),
                Some(quic_cid_index_at(&d, index, n))
            );
        }

        /// The same connection-ID bytes always pick the same socket, and
        /// the index is always a valid socket.
        #[test]
        fn payload_steering_is_stable(
            cid in any::<[u8; 4]>(), rest_a in any::<Vec<u8>>(), rest_b in any::<Vec<u8>>(),
            n in 1u32..64, off in 0usize..8, cpu in 0u32..256,
        ) {
            let mut a = vec![0xAAu8; off];
            a.extend_from_slice(&cid);
            a.extend_from_slice(&rest_a);
            let mut b = vec![0x55u8; off];
            b.extend_from_slice(&cid);
            b.extend_from_slice(&rest_b);
            let prog = by_payload(off as u32, n);
            let ia = run(&prog, &a, cpu).unwrap();
            prop_assert_eq!(Some(ia), run(&prog, &b, cpu + 1));
            prop_assert!(ia < n);
        }
    }
}
