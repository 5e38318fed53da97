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

/// Runs a program built of the instructions above on `payload` as the
/// kernel would, with `cpu` as the receiving CPU. An out-of-bounds load
/// ends the program with 0, as in the kernel.
pub fn run(prog: &[Insn], payload: &[u8], cpu: u32) -> Option<u32> {
    let mut a: u32 = 0;
    for i in prog {
        match i.code {
            LD_W_ABS if i.k == AD_CPU => a = cpu,
            LD_W_ABS => {
                let o = i.k as usize;
                match payload.get(o..o + 4) {
                    Some(b) => a = u32::from_be_bytes(b.try_into().ok()?),
                    None => return Some(0),
                }
            }
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

    proptest! {
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
