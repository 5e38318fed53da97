//! io_uring rings for UDP: a multishot `RECVMSG` into a provided buffer
//! ring, linked batches of `SENDMSG`, and `SENDMSG_ZC` (Linux only, the
//! `uring` feature), on the `io-uring` crate.
//!
//! # Who owns which memory, and when
//!
//! io_uring hands memory to the kernel for longer than a syscall: that is
//! the whole safety question here, and these are the arguments, one per kind
//! of memory.
//!
//! * **Receive buffers** ([`RecvRing`]). One anonymous `mmap` region, cut
//!   into `nbufs` buffers, and a page-aligned buffer ring (another `mmap`)
//!   registered with `IORING_REGISTER_PBUF_RING`. A buffer whose entry sits
//!   in the ring (between the kernel's head and the tail we publish) is the
//!   kernel's: it may write into it at any time, and no Rust reference to it
//!   exists. A completion with `IORING_CQE_F_BUFFER` hands that one buffer
//!   back to us: we read it (only the bytes the completion counts, all of
//!   which the kernel wrote; the mapping is zero-filled memory, so every
//!   byte is initialised anyway), pass a shared slice of it to the caller's
//!   callback, whose lifetime ends with the call, and only then write its
//!   entry back into the ring and publish the new tail with a release store.
//!   So a buffer is never both referenced by Rust and owned by the kernel.
//!   A borrowed receive (`hold`) keeps the buffers of a batch out of the
//!   ring after the callback, in `RecvRing::held`; slices of them are lent
//!   only through `&self` (`RecvRing::held_payload`), and they go back
//!   only in `RecvRing::release_held`, which takes `&mut self`, so no such
//!   slice outlives its buffer's return. Every receive releases what an
//!   earlier one held first.
//!   The `msghdr` the multishot request was built from lives in a `Box` as
//!   long as the ring.
//! * **Teardown with a receive in flight.** Dropping a [`RecvRing`] cancels
//!   the multishot request (`IORING_OP_ASYNC_CANCEL`) and waits, up to a
//!   second, for its final completion (one without `IORING_CQE_F_MORE`).
//!   Only then are the buffer ring unregistered and the mappings unmapped.
//!   If the final completion never comes, the mappings are leaked, never
//!   unmapped: the kernel may still write into them, and leaked memory is
//!   never reused. The socket may be closed first: an armed request holds
//!   its own reference to the file.
//! * **Send batches** ([`SendRing::send_batch`]). Headers, addresses,
//!   iovecs and control data are built in heap slots the ring owns; the
//!   payloads are the caller's, borrowed for the call. The `SENDMSG`s are
//!   one linked chain, or unlinked, each completing on its own; the call
//!   reconciles their completions by index. The call does not
//!   return before every completion of its batch arrived, so nothing it
//!   borrowed is in use when it returns. The kernel only reads send memory:
//!   even in the one case where the call gives up early (the ring itself
//!   failing, which marks it broken, never to be entered again), no
//!   memory of ours can be written.
//! * **Zerocopy sends** ([`ZcRing`]). The kernel reads the payload until it
//!   posts the notification completion (`IORING_CQE_F_NOTIF`), long after
//!   the send completed. The payload is a `Vec<u8>` moved into the ring's
//!   slot table: its heap block does not move while the `Vec` is held, and
//!   the ring gives the `Vec` back only on that slot's notification (or at
//!   once when the first completion says none follows, no
//!   `IORING_CQE_F_MORE`). Dropping a [`ZcRing`] waits up to a second for
//!   outstanding notifications and leaks the buffers still held after that,
//!   the same guarantee as fastudp-io's `ZeroCopySender`.
//! * **The send pool** (`SendPool`). One anonymous mapping owned by the
//!   [`ZcRing`], registered as fixed buffer 0. A pool buffer is written
//!   (through `&mut self`) only while it is free, taken out of the free
//!   list and named by no request; from its send until that slot's
//!   notification it is only read, by the kernel and through the shared
//!   slice its header was built from. The registration pins the pages
//!   until the ring is closed; the mapping is unmapped after the ring is
//!   dropped, or leaked with the held buffers when a notification never
//!   came. The registered file holds its own reference to the socket.

use super::linux::{addr_from_bytes, empty_msghdr, raw_addr, RawAddr};
use super::{SendMsg, MAX_BATCH, SEND_CONTROL_LEN};
use crate::wire::cmsg::CMSG_BUF_LEN;
use io_uring::{cqueue, opcode, squeue, types, IoUring, Probe};
use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// `IORING_SEND_ZC_REPORT_USAGE` (6.2): the notification says whether the
/// kernel copied. Zerocopy send flags travel in the SQE's `ioprio`.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`: set in a notification's result when the
/// kernel copied the data after all.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// Buffer group id of the receive buffer ring (one group per ring).
const BGID: u16 = 0;
/// `user_data` of the multishot receive.
const RECV_TAG: u64 = 1;
/// `user_data` of cancel requests (their completions are ignored).
const CANCEL_TAG: u64 = u64::MAX;
/// Room for the source address in each receive buffer: a `sockaddr_in6`
/// (28 bytes), rounded up to 8 so that control data stays aligned.
const NAME_LEN: usize = 32;
/// `sizeof(struct io_uring_recvmsg_out)`.
const OUT_HDR: usize = 16;
/// Bytes of each receive buffer before the payload.
pub const RECV_OVERHEAD: usize = OUT_HDR + NAME_LEN + CMSG_BUF_LEN;
/// Longest teardown waits for the kernel to give memory back.
const TEARDOWN_WAIT: Duration = Duration::from_secs(1);

/// The opcodes and registrations fastudp uses, as the kernel reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ops {
    /// `IORING_OP_RECVMSG` (multishot needs 6.0; found out when armed).
    pub recvmsg: bool,
    /// `IORING_OP_SENDMSG`.
    pub sendmsg: bool,
    /// `IORING_OP_SENDMSG_ZC` (6.1).
    pub sendmsg_zc: bool,
    /// `IORING_OP_ASYNC_CANCEL`.
    pub async_cancel: bool,
    /// `IORING_REGISTER_PBUF_RING` (5.19).
    pub buf_ring: bool,
}

/// Creates a small ring and asks the kernel which opcodes it supports
/// (`IORING_REGISTER_PROBE`) and whether it takes a provided buffer ring.
/// The error of `io_uring_setup` says why io_uring is unavailable
/// (`ENOSYS`: not built in or filtered by seccomp; `EPERM`:
/// `kernel.io_uring_disabled` or seccomp).
pub fn probe() -> Result<Ops, (&'static str, io::Error)> {
    let ring = IoUring::new(8).map_err(|e| ("io_uring_setup", e))?;
    let mut p = Probe::new();
    ring.submitter()
        .register_probe(&mut p)
        .map_err(|e| ("IORING_REGISTER_PROBE", e))?;
    let buf_ring = BufRingMem::new(1, 64)
        .and_then(|m| m.register(&ring))
        .is_ok();
    Ok(Ops {
        recvmsg: p.is_supported(opcode::RecvMsgMulti::CODE),
        sendmsg: p.is_supported(opcode::SendMsg::CODE),
        sendmsg_zc: p.is_supported(opcode::SendMsgZc::CODE),
        async_cancel: p.is_supported(opcode::AsyncCancel::CODE),
        buf_ring,
    })
}

/// A ring with `entries` submission slots and twice that for completions;
/// cooperative task running where the kernel has it (5.19), as no signal
/// needs to interrupt a thread for completions it will reap itself.
fn new_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::builder()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .setup_cqsize(entries * 2)
        .build(entries)
        .or_else(|_| IoUring::builder().setup_cqsize(entries * 2).build(entries))
}

/// Pushes one entry and submits it.
fn push(ring: &mut IoUring, e: &squeue::Entry) -> io::Result<()> {
    // SAFETY: every entry pushed here points only at memory whose lifetime
    // the caller's type guarantees until the matching completion (see the
    // module docs); a cancel entry points at nothing.
    let r = unsafe { ring.submission().push(e) };
    if r.is_err() {
        ring.submit()?;
        // SAFETY: as above.
        unsafe { ring.submission().push(e) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
    }
    Ok(())
}

/// Waits for at least one completion, up to `timeout` (forever when
/// `None`). Returns false on a timeout or a signal.
fn wait_cqe(ring: &IoUring, timeout: Option<Duration>) -> io::Result<bool> {
    let r = match timeout {
        None => ring.submit_and_wait(1),
        Some(t) => {
            let ts = types::Timespec::from(t);
            let args = types::SubmitArgs::new().timespec(&ts);
            ring.submitter().submit_with_args(1, &args)
        }
    };
    match r {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR)) => Ok(false),
        // EBUSY: the completion queue overflowed; reaping makes room.
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(true),
        Err(e) => Err(e),
    }
}

/// An anonymous, private, zero-filled mapping.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory, owned by one value; which thread
// holds that value does not matter.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a new anonymous mapping touches no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: p as *mut u8,
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the region was mapped by `new` and is unmapped once; the
        // owners drop a mapping only when the kernel no longer uses it
        // (module docs), and leak it otherwise.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// `struct io_uring_buf`; the `resv` field of entry 0 is the ring's tail.
#[repr(C)]
struct RawBuf {
    addr: u64,
    len: u32,
    bid: u16,
    resv: u16,
}

/// A provided buffer ring with its buffers.
struct BufRingMem {
    ring: Mapping,
    bufs: Mapping,
    nbufs: u16,
    buf_len: usize,
    tail: u16,
}

impl BufRingMem {
    /// `nbufs` (a power of two) buffers of `buf_len` bytes, all in the ring.
    fn new(nbufs: u16, buf_len: usize) -> io::Result<Self> {
        let ring = Mapping::new((nbufs as usize * size_of::<RawBuf>()).max(4096))?;
        let bufs = Mapping::new(nbufs as usize * buf_len)?;
        let mut m = BufRingMem {
            ring,
            bufs,
            nbufs,
            buf_len,
            tail: 0,
        };
        for bid in 0..nbufs {
            m.put(bid);
        }
        Ok(m)
    }

    fn register(&self, ring: &IoUring) -> io::Result<()> {
        // SAFETY: the ring mapping is page-aligned, holds `nbufs` entries
        // and lives until unregistered (or leaked): see `RecvRing::drop`.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(self.ring.ptr as u64, self.nbufs, BGID, 0)
        }
    }

    /// Gives buffer `bid` (one we own) to the kernel: writes its entry at
    /// the tail, then publishes the tail.
    fn put(&mut self, bid: u16) {
        self.write_entry(bid);
        self.publish();
    }

    /// Writes buffer `bid`'s entry (one we own) at the tail, without
    /// publishing it: the kernel sees it after [`BufRingMem::publish`].
    fn write_entry(&mut self, bid: u16) {
        let slot = (self.tail & (self.nbufs - 1)) as usize;
        let base = self.ring.ptr as *mut RawBuf;
        // SAFETY: `slot < nbufs`, inside the ring mapping. The kernel reads
        // entries only below the tail it sees, so this entry is ours until
        // the release store below; `resv` (the tail, in entry 0) is not
        // written here.
        unsafe {
            let e = base.add(slot);
            std::ptr::addr_of_mut!((*e).addr)
                .write(self.bufs.ptr.add(bid as usize * self.buf_len) as u64);
            std::ptr::addr_of_mut!((*e).len).write(self.buf_len as u32);
            std::ptr::addr_of_mut!((*e).bid).write(bid);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    /// Publishes the entries written so far with one release store of the
    /// tail.
    fn publish(&mut self) {
        let base = self.ring.ptr as *mut RawBuf;
        // SAFETY: the tail field is a naturally aligned u16 in the mapping,
        // which the kernel reads with an acquire load; AtomicU16 has the
        // layout of u16.
        let tail = unsafe { &*(std::ptr::addr_of_mut!((*base).resv) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
    }

    /// Buffer `bid`'s bytes `off..off + len` (cut to the buffer).
    ///
    /// # Safety
    /// As [`BufRingMem::buffer`].
    unsafe fn buffer_range(&self, bid: u16, off: usize, len: usize) -> &[u8] {
        // SAFETY: the caller's contract is `buffer`'s; the range is cut to
        // the buffer's own bytes.
        let whole = unsafe { self.buffer(bid, self.buf_len) };
        let off = off.min(whole.len());
        &whole[off..(off + len).min(whole.len())]
    }

    /// Buffer `bid`'s first `len` bytes.
    ///
    /// # Safety
    /// The kernel handed `bid` back (a completion named it) and it was not
    /// put back since.
    unsafe fn buffer(&self, bid: u16, len: usize) -> &[u8] {
        // SAFETY: `bid < nbufs` (the kernel only names buffers we gave
        // it), so the range lies inside the buffer mapping, whose bytes are
        // all initialised (zero-filled, then written by the kernel); by the
        // caller's contract the kernel does not write it while the slice
        // lives.
        unsafe {
            std::slice::from_raw_parts(
                self.bufs.ptr.add(bid as usize * self.buf_len),
                len.min(self.buf_len),
            )
        }
    }
}

/// One received message, borrowed from its provided buffer.
#[derive(Debug)]
pub struct RecvOut<'a> {
    /// The sender.
    pub source: Option<SocketAddr>,
    /// Control data as the kernel wrote it.
    pub control: &'a [u8],
    /// The payload (at most the buffer's room).
    pub payload: &'a [u8],
    /// The payload's length as the kernel reported it.
    pub len: usize,
    /// `msg_flags` (`MSG_TRUNC`, `MSG_CTRUNC`).
    pub flags: i32,
}

/// What one receive completion said.
#[derive(Debug)]
pub enum RecvEvent<'a> {
    /// A message.
    Message(RecvOut<'a>),
    /// The receive failed (`ENOBUFS`: no buffer was free).
    Failed(io::Error),
}

/// A multishot `RECVMSG` on one socket, into a provided buffer ring.
pub struct RecvRing {
    ring: IoUring,
    fd: RawFd,
    /// `None` once leaked at teardown.
    mem: Option<BufRingMem>,
    msg: Box<libc::msghdr>,
    armed: bool,
    /// Buffers handed out by [`RecvRing::drain`] with `hold`, and where
    /// each one's payload lies in it: out of the ring (the kernel does not
    /// write them) until [`RecvRing::release_held`].
    held: Vec<Held>,
}

/// A received message whose buffer is held out of the ring.
#[derive(Debug, Clone, Copy)]
struct Held {
    bid: u16,
    off: u32,
    len: u32,
}

// SAFETY: the raw pointers in `msg` point at nothing (only its lengths are
// used); the ring and the mappings are owned by this value alone.
unsafe impl Send for RecvRing {}

impl std::fmt::Debug for RecvRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing")
            .field("fd", &self.fd)
            .field("armed", &self.armed)
            .finish()
    }
}

impl RecvRing {
    /// A ring of `nbufs` buffers (a power of two, at most 32768) with room
    /// for `payload` bytes each, for socket `fd`. Not armed yet.
    pub fn new(fd: BorrowedFd<'_>, nbufs: u16, payload: usize) -> io::Result<Self> {
        let ring = new_ring(u32::from(nbufs).clamp(8, 4096))?;
        let mem = BufRingMem::new(nbufs, RECV_OVERHEAD + payload)?;
        mem.register(&ring)?;
        let mut msg = Box::new(empty_msghdr());
        msg.msg_namelen = NAME_LEN as _;
        msg.msg_controllen = CMSG_BUF_LEN as _;
        Ok(RecvRing {
            ring,
            fd: fd.as_raw_fd(),
            mem: Some(mem),
            msg,
            armed: false,
            held: Vec::new(),
        })
    }

    /// The payload of held message `i` (in the order `drain` handed them
    /// out), read in place in its provided buffer; empty past the end.
    pub fn held_payload(&self, i: usize) -> &[u8] {
        match (self.held.get(i), self.mem.as_ref()) {
            // SAFETY: a buffer in `held` was handed to us by its completion
            // and is out of the ring: it goes back only in `release_held`,
            // which takes `&mut self`, so no slice borrowed from `&self`
            // here outlives its return to the kernel.
            (Some(h), Some(mem)) => unsafe {
                mem.buffer_range(h.bid, h.off as usize, h.len as usize)
            },
            _ => &[],
        }
    }

    /// Gives every held buffer back to the kernel, with one tail update.
    pub fn release_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        if let Some(mem) = self.mem.as_mut() {
            for h in self.held.drain(..) {
                mem.write_entry(h.bid);
            }
            mem.publish();
        }
        self.held.clear();
    }

    /// True while a multishot receive is armed.
    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Arms the multishot receive.
    pub fn arm(&mut self) -> io::Result<()> {
        let e = opcode::RecvMsgMulti::new(types::Fd(self.fd), &*self.msg, BGID)
            .build()
            .user_data(RECV_TAG);
        // The kernel reads `msg` (a Box owned by self) when the request is
        // prepared; the buffers it writes are the ring's (module docs).
        push(&mut self.ring, &e)?;
        self.ring.submit()?;
        self.armed = true;
        Ok(())
    }

    /// Waits for a completion, up to `timeout` (forever when `None`);
    /// false on a timeout or a signal.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        if !self.ring.completion().is_empty() {
            return Ok(true);
        }
        wait_cqe(&self.ring, timeout)
    }

    /// True when a completion is waiting. Completions the kernel has ready
    /// but not posted yet (task work it defers until this thread enters
    /// the kernel, `IORING_SQ_TASKRUN`) are posted first.
    pub fn ready(&mut self) -> bool {
        if self.ring.completion().is_empty() {
            let pending = {
                let sq = self.ring.submission();
                sq.taskrun() || sq.cq_overflow()
            };
            if pending {
                let _ = self.ring.submit();
            }
        }
        !self.ring.completion().is_empty()
    }

    /// Hands up to `max` completions to `f`, giving each message's buffer
    /// back to the kernel after `f` returns, or, with `hold`, keeping it
    /// out of the ring for [`RecvRing::held_payload`] until
    /// [`RecvRing::release_held`]. A completion without
    /// `IORING_CQE_F_MORE` disarms (see [`RecvRing::armed`]). Returns the
    /// number of completions handed over.
    pub fn drain(&mut self, max: usize, hold: bool, mut f: impl FnMut(RecvEvent<'_>)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(cqe) = self.ring.completion().next() else {
                break;
            };
            if cqe.user_data() != RECV_TAG {
                continue;
            }
            if !cqueue::more(cqe.flags()) {
                self.armed = false;
            }
            let res = cqe.result();
            let Some(mem) = self.mem.as_mut() else {
                break;
            };
            let bid = cqueue::buffer_select(cqe.flags());
            if bid.is_some_and(|b| b >= mem.nbufs) {
                // Never a buffer of ours: nothing to read or give back.
                n += 1;
                f(RecvEvent::Failed(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "io_uring named a receive buffer outside the ring",
                )));
                continue;
            }
            if res < 0 {
                if let Some(bid) = bid {
                    mem.put(bid);
                }
                n += 1;
                f(RecvEvent::Failed(io::Error::from_raw_os_error(-res)));
                continue;
            }
            let Some(bid) = bid else {
                continue;
            };
            // SAFETY: this completion handed `bid` to us; it goes back to
            // the kernel (`put`) only after `f`, whose borrow ends with it.
            let buf = unsafe { mem.buffer(bid, res as usize) };
            let Ok(out) = types::RecvMsgOut::parse(buf, &self.msg) else {
                // Cannot happen (the kernel writes the header, name and
                // control fields whole), but never a silent loss.
                mem.put(bid);
                n += 1;
                f(RecvEvent::Failed(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("io_uring receive of {res} bytes without its header"),
                )));
                continue;
            };
            let payload = out.payload_data();
            let off = payload.as_ptr() as usize - buf.as_ptr() as usize;
            let held = Held {
                bid,
                off: off as u32,
                len: payload.len() as u32,
            };
            {
                let source = addr_from_bytes(out.name_data());
                n += 1;
                f(RecvEvent::Message(RecvOut {
                    source,
                    control: out.control_data(),
                    payload,
                    len: out.incoming_payload_len() as usize,
                    flags: out.flags() as i32,
                }));
            }
            if hold {
                self.held.push(held);
            } else {
                mem.put(bid);
            }
        }
        n
    }
}

impl Drop for RecvRing {
    fn drop(&mut self) {
        let deadline = Instant::now() + TEARDOWN_WAIT;
        if self.armed {
            let c = opcode::AsyncCancel::new(RECV_TAG)
                .build()
                .user_data(CANCEL_TAG);
            let _ = push(&mut self.ring, &c).and_then(|_| self.ring.submit());
        }
        while self.armed && Instant::now() < deadline {
            if wait_cqe(&self.ring, Some(Duration::from_millis(50))).is_err() {
                break;
            }
            self.drain(usize::MAX, false, |_| {});
        }
        if self.armed {
            // The kernel may still write into the buffers: never unmap them.
            std::mem::forget(self.mem.take());
        } else {
            let _ = self.ring.submitter().unregister_buf_ring(BGID);
        }
    }
}

/// A send message's memory: header, iovec, address and control data.
#[repr(C)]
struct Slot {
    hdr: libc::msghdr,
    iov: libc::iovec,
    name: RawAddr,
    ctl: Control,
}

#[repr(C, align(8))]
struct Control([u8; SEND_CONTROL_LEN]);

impl Slot {
    fn new() -> Self {
        Slot {
            hdr: empty_msghdr(),
            iov: libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
            name: RawAddr::zeroed(),
            ctl: Control([0; SEND_CONTROL_LEN]),
        }
    }

    /// Points the header at this slot's address, iovec and control data,
    /// with `m`'s payload.
    fn set(&mut self, m: &SendMsg<'_>) {
        let mut h = empty_msghdr();
        if let Some(dest) = &m.dest {
            let (raw, len) = raw_addr(dest);
            self.name = raw;
            h.msg_name = &mut self.name as *mut RawAddr as *mut libc::c_void;
            h.msg_namelen = len;
        }
        self.iov = libc::iovec {
            iov_base: m.payload.as_ptr() as *mut libc::c_void,
            iov_len: m.payload.len(),
        };
        h.msg_iov = &mut self.iov;
        h.msg_iovlen = 1;
        let clen = m.control_len.min(SEND_CONTROL_LEN);
        if clen > 0 {
            h.msg_control = self.ctl.0.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = clen as _;
        }
        self.hdr = h;
    }
}

/// A ring for batches of `SENDMSG`.
pub struct SendRing {
    ring: IoUring,
    slots: Box<[Slot]>,
    broken: bool,
}

// SAFETY: the slots' raw pointers point into the slots themselves or at
// payloads borrowed only during `send_batch`; the value owns everything.
unsafe impl Send for SendRing {}

impl std::fmt::Debug for SendRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRing")
            .field("broken", &self.broken)
            .finish()
    }
}

impl SendRing {
    /// A ring for batches of up to [`MAX_BATCH`] messages.
    pub fn new() -> io::Result<Self> {
        Ok(SendRing {
            ring: new_ring(MAX_BATCH as u32)?,
            slots: (0..MAX_BATCH).map(|_| Slot::new()).collect(),
            broken: false,
        })
    }

    /// True once the ring itself failed; it is not entered again.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Sends `n` messages (at most [`MAX_BATCH`]) built by `fill`, as in
    /// [`super::send_batch`], in one `io_uring_enter`.
    ///
    /// With `dontwait` every send has `MSG_DONTWAIT` (io_uring waits for
    /// buffer space otherwise, whatever the socket's mode). With `unlinked`
    /// (only with `dontwait`) the `SENDMSG`s are submitted unlinked: the
    /// kernel issues each inline, in order (a
    /// linked one would wait for task work), and each one succeeds or
    /// fails on its own. A failure does not stop the ones after it, so the
    /// completions are reconciled by index ([`SendOutcome`]): `sent` is the
    /// number of messages up to and including the last one that went, and
    /// `holes` marks those before it that failed. With no hole, `sent` is
    /// an exact prefix, as `sendmmsg` reports. A hole is a message that did
    /// not go although later ones did; the caller must resend or account
    /// for it, never resend the later ones.
    ///
    /// Otherwise the batch is one chain of linked `SENDMSG`s: a failure
    /// cancels the rest, so what went out is a prefix and there is never a
    /// hole (a chain that waits for buffer space also keeps its order).
    ///
    /// Returns `Err` from `fill` as the outer error.
    pub fn send_batch<'a, E>(
        &mut self,
        fd: BorrowedFd<'_>,
        n: usize,
        unlinked: bool,
        dontwait: bool,
        mut fill: impl FnMut(usize, &mut [u8]) -> Result<SendMsg<'a>, E>,
    ) -> Result<SendOutcome, E> {
        let n = n.min(MAX_BATCH);
        let mut out = SendOutcome {
            sent: Ok(0),
            holes: 0,
            enters: 0,
        };
        if n == 0 {
            return Ok(out);
        }
        if self.broken {
            out.sent = Err(io::Error::other("io_uring send ring failed"));
            return Ok(out);
        }
        for i in 0..n {
            let s = &mut self.slots[i];
            s.ctl.0.fill(0);
            let m = fill(i, &mut s.ctl.0)?;
            s.set(&m);
        }
        let inject = inject::take();
        for i in 0..n {
            let mut flags = if dontwait { libc::MSG_DONTWAIT } else { 0 };
            if inject & (1u128 << i) != 0 {
                // A failure the kernel itself reports (udp_sendmsg refuses
                // MSG_OOB with EOPNOTSUPP): only in the crate's tests.
                flags |= libc::MSG_OOB;
            }
            let mut e = opcode::SendMsg::new(types::Fd(fd.as_raw_fd()), &self.slots[i].hdr)
                .flags(flags as u32)
                .build()
                .user_data(i as u64);
            if !unlinked && i + 1 < n {
                e = e.flags(squeue::Flags::IO_LINK);
            }
            // SAFETY: the entry points at slot `i` (owned by self) and, through
            // it, at a payload borrowed for 'a; this call returns only after
            // the entry's completion (module docs).
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                // Cannot happen: the queue has MAX_BATCH entries and is
                // empty between calls.
                self.broken = true;
                out.sent = Err(io::Error::other("io_uring submission queue full"));
                return Ok(out);
            }
        }
        let mut res = [0i32; MAX_BATCH];
        let mut seen = 0;
        while seen < n {
            out.enters += 1;
            match self.ring.submit_and_wait(n - seen) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {}
                Err(e) => {
                    // The ring failed: it is never entered again, so entries
                    // still queued are never seen by the kernel, and those it
                    // took only read memory (module docs).
                    self.broken = true;
                    out.sent = Err(e);
                    return Ok(out);
                }
            }
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                if i < n {
                    res[i] = cqe.result();
                    seen += 1;
                }
            }
        }
        let (sent, holes) = reconcile(&res[..n]);
        out.holes = holes;
        out.sent = if sent > 0 {
            Ok(sent)
        } else {
            Err(io::Error::from_raw_os_error(-res[0]))
        };
        Ok(out)
    }
}

/// What a batch on the [`SendRing`] did.
#[derive(Debug)]
pub struct SendOutcome {
    /// Messages up to and including the last one sent, or the first
    /// one's error when none was.
    pub sent: io::Result<usize>,
    /// Bit `i` set: message `i` (below `sent`) failed while a later one
    /// went out.
    pub holes: u128,
    /// `io_uring_enter` calls made.
    pub enters: u64,
}

/// Reconciles per-message results (`>= 0` sent, else `-errno`) into the
/// number of messages up to the last one sent, and the failed ones before
/// it (bit `i` for message `i`, at most 128).
pub fn reconcile(res: &[i32]) -> (usize, u128) {
    let sent = res.iter().rposition(|&r| r >= 0).map_or(0, |q| q + 1);
    let holes = res[..sent]
        .iter()
        .enumerate()
        .filter(|(_, &r)| r < 0)
        .fold(0u128, |m, (i, _)| m | 1u128 << i);
    (sent, holes)
}

/// Send failures injected by the crate's tests; nothing outside them.
pub mod inject {
    #[cfg(any(test, feature = "test-inject"))]
    thread_local! {
        static MASKS: std::cell::RefCell<std::collections::VecDeque<u128>> =
            Default::default();
    }

    /// Queues one mask per coming ring batch on this thread: bit `i`
    /// makes the kernel fail that batch's message `i`.
    #[cfg(any(test, feature = "test-inject"))]
    pub fn fail_next(masks: &[u128]) {
        MASKS.with(|m| m.borrow_mut().extend(masks.iter().copied()));
    }

    #[cfg(any(test, feature = "test-inject"))]
    thread_local! {
        static REFUSE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    /// Makes the next `n` registrations (of a send pool or a file) on
    /// this thread fail as if the kernel refused them (`EPERM`).
    #[cfg(any(test, feature = "test-inject"))]
    pub fn refuse_registrations(n: u32) {
        REFUSE.with(|r| r.set(n));
    }

    /// Whether this registration is to be refused (never outside the
    /// tests).
    pub(super) fn refuse_register() -> bool {
        #[cfg(any(test, feature = "test-inject"))]
        return REFUSE.with(|r| {
            let n = r.get();
            r.set(n.saturating_sub(1));
            n > 0
        });
        #[cfg(not(any(test, feature = "test-inject")))]
        false
    }

    /// The mask for this batch (0 outside the tests).
    pub(super) fn take() -> u128 {
        #[cfg(any(test, feature = "test-inject"))]
        return MASKS.with(|m| m.borrow_mut().pop_front().unwrap_or(0));
        #[cfg(not(any(test, feature = "test-inject")))]
        0
    }
}

/// What a zerocopy send's completions said, for one buffer.
#[derive(Debug)]
pub struct ZcDone {
    /// The ring slot the send used (unique among the buffers of one reap).
    pub slot: usize,
    /// The caller's buffer, free again; empty for a send from the pool,
    /// whose pool buffer went back to the pool.
    pub buf: Vec<u8>,
    /// The send was from the pool.
    pub pooled: bool,
    /// The kernel copied the data rather than sending from the buffer.
    pub copied: bool,
    /// The send's own outcome.
    pub result: io::Result<()>,
}

/// What a zerocopy send sends.
pub enum ZcSrc<'w> {
    /// A buffer of the caller's, held by the ring until the notification.
    Owned(Vec<u8>),
    /// `len` bytes in a free buffer of the ring's pool, written by `write`
    /// (called once, when a slot and a pool buffer are free).
    Pool {
        /// Bytes to send (at most the pool's buffer length).
        len: usize,
        /// Writes the payload.
        write: &'w mut dyn FnMut(&mut [u8]),
    },
}

/// A zerocopy send that failed: the error, and the caller's buffer back
/// when the kernel let go of it (`None` only if the ring itself failed).
pub type ZcFailure = (io::Error, Option<Vec<u8>>);

/// The memory a slot in flight sends from.
#[derive(Debug)]
enum HeldBuf {
    Owned(Vec<u8>),
    /// Pool buffer `idx`, `len` bytes of it.
    Pool(usize, usize),
}

/// Send buffers the ring owns: one anonymous mapping cut into `count`
/// buffers of `len` bytes, registered (where the kernel allows) as fixed
/// buffer 0 with `IORING_REGISTER_BUFFERS`, so that `SENDMSG_ZC` with
/// `IORING_RECVSEND_FIXED_BUF` skips pinning the pages on every send.
///
/// A pool buffer is either free (in `free`: no request names it, so the
/// kernel does not read it; the registration only pins its pages), or in
/// flight (named by a slot in `ZcRing::held` until that slot's
/// notification). The only `&mut` to a pool buffer is made for a free one
/// just taken out of `free`, and ends before the send that names it is
/// pushed; the only `&` ones (the payload of a header) live while the
/// buffer is in flight, and the kernel only reads send memory.
struct SendPool {
    mem: Mapping,
    len: usize,
    free: Vec<usize>,
    /// Registered with the kernel, and fixed sends of it accepted.
    fixed: bool,
}

impl SendPool {
    /// Buffer `idx`'s first `len` bytes.
    fn buf(&self, idx: usize, len: usize) -> &[u8] {
        // SAFETY: `idx` names a buffer inside the mapping (the pool hands
        // out only `idx < count`, and `len` is cut to the buffer length);
        // the mapping is zero-filled so every byte is initialised, and no
        // `&mut` to it lives (module docs: only a free buffer is written,
        // through `&mut self`).
        unsafe { std::slice::from_raw_parts(self.mem.ptr.add(idx * self.len), len.min(self.len)) }
    }

    /// Buffer `idx`'s first `len` bytes, to write: `idx` must be free
    /// (just taken out of `free`, not yet named by a request).
    fn buf_mut(&mut self, idx: usize, len: usize) -> &mut [u8] {
        // SAFETY: as `buf`, and exclusive: the buffer is taken out of
        // `free` and not in flight, so neither the kernel nor another
        // slice reads it while `&mut self` is held.
        unsafe {
            std::slice::from_raw_parts_mut(self.mem.ptr.add(idx * self.len), len.min(self.len))
        }
    }
}

/// `IORING_RECVSEND_FIXED_BUF`: the payload lies in a registered buffer.
const RECVSEND_FIXED_BUF: u16 = 1 << 2;

/// Why the pool's registration or its fixed sends were refused, with the
/// errno.
#[derive(Debug)]
pub struct Refused {
    /// What failed.
    pub what: &'static str,
    /// The error.
    pub error: io::Error,
}

/// Zerocopy sends (`SENDMSG_ZC`) whose buffers the ring holds until the
/// notification.
pub struct ZcRing {
    ring: IoUring,
    slots: Box<[Slot]>,
    /// The buffer of each slot in use, and the send's outcome once known.
    held: Vec<Option<(HeldBuf, Option<i32>)>>,
    free: Vec<usize>,
    pool: Option<SendPool>,
    /// The socket registered as fixed file 0 (`IORING_REGISTER_FILES`).
    file: Option<RawFd>,
}

// SAFETY: as for SendRing; the held buffers are owned `Vec`s, and the
// pool's mapping is owned by the ring.
unsafe impl Send for ZcRing {}

impl std::fmt::Debug for ZcRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZcRing")
            .field("in_flight", &self.in_flight())
            .field("pool_fixed", &self.pool_fixed())
            .field("file", &self.file)
            .finish()
    }
}

/// Most zerocopy sends in flight on one ring.
pub const ZC_SLOTS: usize = 64;

/// Largest send pool: one registered buffer holds at most 1 GiB, and a
/// pool is pinned memory.
pub const POOL_MAX_BYTES: usize = 256 << 20;

impl ZcRing {
    /// A ring for up to [`ZC_SLOTS`] sends in flight.
    pub fn new() -> io::Result<Self> {
        Ok(ZcRing {
            ring: new_ring(ZC_SLOTS as u32 * 2)?,
            slots: (0..ZC_SLOTS).map(|_| Slot::new()).collect(),
            held: (0..ZC_SLOTS).map(|_| None).collect(),
            free: (0..ZC_SLOTS).rev().collect(),
            pool: None,
            file: None,
        })
    }

    /// Buffers the kernel may still read.
    pub fn in_flight(&self) -> usize {
        ZC_SLOTS - self.free.len()
    }

    /// Registers socket `fd` as fixed file 0, used by sends that ask for
    /// it. The registration holds its own reference to the socket until
    /// the ring is dropped.
    pub fn register_file(&mut self, fd: RawFd) -> io::Result<()> {
        if inject::refuse_register() {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        self.ring.submitter().register_files(&[fd])?;
        self.file = Some(fd);
        Ok(())
    }

    /// The socket registered as fixed file 0.
    pub fn file(&self) -> Option<RawFd> {
        self.file
    }

    /// Sets up a pool of `count` buffers of `len` bytes (a pool already
    /// there stays). Registers it and checks that the kernel takes fixed
    /// buffers for `SENDMSG_ZC` (Linux 6.15); where either is refused the
    /// pool still serves, as ordinary memory, and the refusal is returned
    /// in `Ok(Some)`. `Err` only when the memory cannot be had, or the
    /// pool is larger than [`POOL_MAX_BYTES`].
    pub fn setup_pool(&mut self, count: usize, len: usize) -> io::Result<Option<Refused>> {
        if self.pool.is_some() {
            return Ok(None);
        }
        let bytes = count
            .checked_mul(len)
            .filter(|&b| b > 0 && b <= POOL_MAX_BYTES)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a send pool of {count} x {len} bytes: it must hold 1 to {POOL_MAX_BYTES} bytes"),
                )
            })?;
        let mem = Mapping::new(bytes)?;
        let iov = libc::iovec {
            iov_base: mem.ptr as *mut libc::c_void,
            iov_len: bytes,
        };
        let mut pool = SendPool {
            mem,
            len,
            free: (0..count).rev().collect(),
            fixed: false,
        };
        let refused = if inject::refuse_register() {
            Some(Refused {
                what: "IORING_REGISTER_BUFFERS",
                error: io::Error::from_raw_os_error(libc::EPERM),
            })
        } else {
            // SAFETY: the region is the pool's own mapping, which lives as
            // long as the ring (the pool is dropped after the ring, or
            // leaked while the kernel may still read it: `Drop`).
            match unsafe { self.ring.submitter().register_buffers(&[iov]) } {
                Err(error) => Some(Refused {
                    what: "IORING_REGISTER_BUFFERS",
                    error,
                }),
                Ok(()) => match self.probe_fixed(&pool) {
                    Ok(()) => None,
                    Err(error) => {
                        let _ = self.ring.submitter().unregister_buffers();
                        Some(Refused {
                            what: "IORING_OP_SENDMSG_ZC with IORING_RECVSEND_FIXED_BUF",
                            error,
                        })
                    }
                },
            }
        };
        pool.fixed = refused.is_none();
        self.pool = Some(pool);
        Ok(refused)
    }

    /// Asks the kernel whether it takes a registered buffer for
    /// `SENDMSG_ZC`: one byte of the pool, on a new unbound UDP socket,
    /// with no destination. A kernel that takes it gets as far as UDP,
    /// which answers `EDESTADDRREQ` (nothing is sent); one that does not
    /// refuses the request with `EINVAL` before.
    fn probe_fixed(&mut self, pool: &SendPool) -> io::Result<()> {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
        let mut iov = libc::iovec {
            iov_base: pool.mem.ptr as *mut libc::c_void,
            iov_len: 1,
        };
        let mut hdr = empty_msghdr();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        let e = opcode::SendMsgZc::new(types::Fd(sock.as_raw_fd()), &hdr)
            .flags(libc::MSG_DONTWAIT as u32)
            .ioprio(RECVSEND_FIXED_BUF)
            .build()
            .user_data(PROBE_TAG);
        push(&mut self.ring, &e)?;
        let deadline = Instant::now() + TEARDOWN_WAIT;
        let mut result = None;
        let mut notif_due = false;
        loop {
            for cqe in self.ring.completion() {
                if cqe.user_data() != PROBE_TAG {
                    continue;
                }
                if cqueue::notif(cqe.flags()) {
                    notif_due = false;
                } else {
                    result = Some(cqe.result());
                    notif_due = cqueue::more(cqe.flags());
                }
            }
            if result.is_some() && !notif_due {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // The header and the iovec live on this stack: the request
                // must be over before they go. It reads only, and a
                // kernel that never completes it is a broken ring.
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the probe send never completed",
                ));
            }
            wait_cqe(&self.ring, Some(left.min(Duration::from_millis(50))))?;
        }
        match result {
            Some(r) if r == -libc::EDESTADDRREQ || r >= 0 => Ok(()),
            Some(r) => Err(io::Error::from_raw_os_error(-r)),
            None => Err(io::Error::other("no completion")),
        }
    }

    /// The pool is registered and the kernel sends from it as fixed
    /// buffers.
    pub fn pool_fixed(&self) -> bool {
        self.pool.as_ref().is_some_and(|p| p.fixed)
    }

    /// Length of each pool buffer (0 without a pool).
    pub fn pool_len(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| p.len)
    }

    /// Pool buffers free.
    pub fn pool_free(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| p.free.len())
    }

    /// Pool buffer indices held by sends in flight (for the tests).
    #[cfg(any(test, feature = "test-inject"))]
    pub fn pool_in_flight(&self) -> Vec<usize> {
        self.held
            .iter()
            .filter_map(|h| match h {
                Some((HeldBuf::Pool(idx, _), _)) => Some(*idx),
                _ => None,
            })
            .collect()
    }

    /// The index of the pool buffer that `p` points into (for the tests).
    #[cfg(any(test, feature = "test-inject"))]
    pub fn pool_index_of(&self, p: *const u8) -> Option<usize> {
        let pool = self.pool.as_ref()?;
        let off = (p as usize).checked_sub(pool.mem.ptr as usize)?;
        (off < pool.mem.len).then_some(off / pool.len)
    }

    /// Sends `src` with `SENDMSG_ZC`, its header built by `fill` (control
    /// data into the given buffer; the payload must be the one given).
    /// With `fixed_file`, the socket is named as registered file 0 (the
    /// caller checked that `fd` is that socket). Waits for the send's own
    /// completion (not the notification): `Ok` means it was sent, and the
    /// ring holds the buffer until the notification, when it goes to
    /// `done` with the other finished buffers (a pool buffer goes back to
    /// the pool). On an error the caller's buffer comes back with it, once
    /// the kernel let go of it (for a pool send, a copy of its payload;
    /// `None` only if the ring itself failed: the buffer is then kept,
    /// and comes back through `done` if the kernel ever lets it go).
    /// `WouldBlock`, without a send and without calling a pool send's
    /// `write`, when all slots or all pool buffers are in flight (or there
    /// is no pool). `msg_flags` is `MSG_DONTWAIT` for a non-blocking
    /// socket (io_uring waits for buffer space otherwise, whatever the
    /// socket's mode).
    pub fn send<E>(
        &mut self,
        fd: BorrowedFd<'_>,
        fixed_file: bool,
        msg_flags: i32,
        src: ZcSrc<'_>,
        fill: impl for<'b> FnOnce(&'b [u8], &mut [u8]) -> Result<SendMsg<'b>, E>,
        done: &mut Vec<ZcDone>,
    ) -> Result<Result<(), ZcFailure>, (E, Vec<u8>)> {
        let (i, held) = match self.claim(src) {
            Ok(c) => c,
            Err(f) => return Ok(Err(f)),
        };
        if let Err(f) = self.post(i, held, fd, fixed_file, msg_flags, fill)? {
            return Ok(Err(f));
        }
        Ok(self.wait_sent(i, done))
    }

    /// A free slot, and the buffer it will send from: the caller's, or a
    /// free pool buffer written by the source's `write`. `WouldBlock`
    /// (the caller's buffer back) when none is free.
    fn claim(&mut self, src: ZcSrc<'_>) -> Result<(usize, HeldBuf), ZcFailure> {
        let would_block = || io::Error::from(io::ErrorKind::WouldBlock);
        let Some(i) = self.free.pop() else {
            return Err((
                would_block(),
                Some(match src {
                    ZcSrc::Owned(b) => b,
                    ZcSrc::Pool { .. } => Vec::new(),
                }),
            ));
        };
        let held = match src {
            ZcSrc::Owned(b) => HeldBuf::Owned(b),
            ZcSrc::Pool { len, write } => {
                let Some(pool) = self.pool.as_mut().filter(|p| len <= p.len) else {
                    self.free.push(i);
                    let e = match &self.pool {
                        None => io::Error::new(io::ErrorKind::Unsupported, "no send pool"),
                        Some(p) => io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("{len} bytes do not fit a {}-byte pool buffer", p.len),
                        ),
                    };
                    return Err((e, Some(Vec::new())));
                };
                let Some(idx) = pool.free.pop() else {
                    self.free.push(i);
                    return Err((would_block(), Some(Vec::new())));
                };
                write(pool.buf_mut(idx, len));
                HeldBuf::Pool(idx, len)
            }
        };
        Ok((i, held))
    }

    /// Builds slot `i`'s header around `held` with `fill`, and pushes its
    /// `SENDMSG_ZC` onto the ring (not yet submitted). From then on the slot
    /// holds the buffer until its notification. On an error the slot is
    /// free again, and the buffer comes back with it.
    fn post<E>(
        &mut self,
        i: usize,
        held: HeldBuf,
        fd: BorrowedFd<'_>,
        fixed_file: bool,
        msg_flags: i32,
        fill: impl for<'b> FnOnce(&'b [u8], &mut [u8]) -> Result<SendMsg<'b>, E>,
    ) -> Result<Result<(), ZcFailure>, (E, Vec<u8>)> {
        let (payload, fixed_buf): (&[u8], bool) = match &held {
            HeldBuf::Owned(b) => (b, false),
            HeldBuf::Pool(idx, len) => {
                let pool = self.pool.as_ref().expect("a pool send has a pool");
                (pool.buf(*idx, *len), pool.fixed)
            }
        };
        let s = &mut self.slots[i];
        s.ctl.0.fill(0);
        match fill(payload, &mut s.ctl.0) {
            Ok(m) => s.set(&m),
            Err(e) => {
                let data = payload.to_vec();
                self.release(i, held);
                return Err((e, data));
            }
        }
        let mut ioprio = SEND_ZC_REPORT_USAGE;
        if fixed_buf {
            // Fixed buffer 0 (the whole pool): `buf_index` stays 0.
            ioprio |= RECVSEND_FIXED_BUF;
        }
        let mut flags = msg_flags;
        if inject::take() & 1 != 0 {
            // A failure the kernel itself reports (udp_sendmsg refuses
            // MSG_OOB with EOPNOTSUPP): only in the crate's tests.
            flags |= libc::MSG_OOB;
        }
        let e = match (fixed_file, self.file) {
            (true, Some(_)) => opcode::SendMsgZc::new(types::Fixed(0), &self.slots[i].hdr),
            _ => opcode::SendMsgZc::new(types::Fd(fd.as_raw_fd()), &self.slots[i].hdr),
        }
        .flags(flags as u32)
        .ioprio(ioprio)
        .build()
        .user_data(i as u64);
        // The slot holds its buffer from here until its notification (or a
        // completion that says none follows).
        self.held[i] = Some((held, None));
        if let Err(e) = push(&mut self.ring, &e) {
            let h = self.held[i].take().map(|h| h.0);
            let data = h.map(|h| self.release(i, h));
            return Ok(Err((e, data)));
        }
        Ok(Ok(()))
    }

    /// Submits, and waits for slot `i`'s own completion (and, when it
    /// failed, for its notification, which brings the buffer back).
    fn wait_sent(&mut self, i: usize, done: &mut Vec<ZcDone>) -> Result<(), ZcFailure> {
        // No deadline: a send without MSG_DONTWAIT on a blocking socket
        // waits for buffer space as the socket would, and giving up while
        // it is queued could have the caller send it again.
        let mut outcome: Option<i32> = None;
        loop {
            let submitted = self.ring.submit();
            let before = done.len();
            self.reap_with_data(done, Some(i));
            match &self.held[i] {
                Some((_, Some(r))) if outcome.is_none() => {
                    if *r >= 0 {
                        return Ok(());
                    }
                    // Failed, and a notification follows: wait for it.
                    outcome = Some(*r);
                }
                Some(_) => {}
                // Done: its buffer is among those just reaped.
                None => return Self::finished(i, outcome, before, done),
            }
            if let Err(e) = submitted {
                if !matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) {
                    return Err((e, None));
                }
            }
            if let Err(e) = wait_cqe(&self.ring, None) {
                // The ring itself failed: the buffer stays held (and is
                // leaked at teardown if the kernel never lets it go).
                return Err((e, None));
            }
        }
    }

    /// The outcome of slot `i`, whose buffer is among `done[before..]`
    /// (just reaped): `outcome` is the failure its completion reported, if
    /// any. A failed send takes its buffer out of `done` and back to the
    /// caller; a sent one leaves it there, done.
    fn finished(
        i: usize,
        outcome: Option<i32>,
        before: usize,
        done: &mut Vec<ZcDone>,
    ) -> Result<(), ZcFailure> {
        let k = (before..done.len()).find(|&k| done[k].slot == i);
        let d = k.map(|k| done.remove(k));
        let r = outcome.or_else(|| {
            d.as_ref()
                .and_then(|d| d.result.as_ref().err())
                .and_then(|e| e.raw_os_error())
                .map(|e| -e)
        });
        match (r, d) {
            (Some(r), d) if r < 0 => Err((io::Error::from_raw_os_error(-r), d.map(|d| d.buf))),
            (_, Some(mut d)) => {
                // Sent, no notification: hand it over as done.
                if d.pooled {
                    d.buf = Vec::new();
                }
                done.push(d);
                Ok(())
            }
            (_, None) => Ok(()),
        }
    }

    /// Frees slot `i` and the buffer it held (no request names them):
    /// the caller's buffer back, or a pool buffer's payload copied out
    /// (when `copy`) before it goes back to the pool.
    fn release_with(&mut self, i: usize, h: HeldBuf, copy: bool) -> Vec<u8> {
        self.free.push(i);
        match h {
            HeldBuf::Owned(b) => b,
            HeldBuf::Pool(idx, len) => {
                let pool = self.pool.as_mut().expect("a pool send has a pool");
                let data = if copy {
                    pool.buf(idx, len).to_vec()
                } else {
                    Vec::new()
                };
                pool.free.push(idx);
                data
            }
        }
    }

    fn release(&mut self, i: usize, h: HeldBuf) -> Vec<u8> {
        self.release_with(i, h, true)
    }

    /// Reads every completion queued now, without waiting; buffers whose
    /// notification arrived go to `done` (pool buffers back to the pool).
    pub fn reap(&mut self, done: &mut Vec<ZcDone>) {
        self.reap_with_data(done, None);
    }

    /// As `reap`; a failed pool send in slot `keep` comes with a copy of
    /// its payload (for the caller's fallback).
    fn reap_with_data(&mut self, done: &mut Vec<ZcDone>, keep: Option<usize>) {
        let mut finished: Vec<(usize, i32, bool)> = Vec::new();
        for cqe in self.ring.completion() {
            let i = cqe.user_data() as usize;
            if i >= ZC_SLOTS {
                continue;
            }
            let flags = cqe.flags();
            let res = cqe.result();
            if cqueue::notif(flags) {
                if let Some((_, r)) = self.held[i].as_ref() {
                    finished.push((i, r.unwrap_or(0), res as u32 & NOTIF_USAGE_ZC_COPIED != 0));
                }
            } else if cqueue::more(flags) {
                if let Some((_, r)) = self.held[i].as_mut() {
                    *r = Some(res);
                }
            } else if self.held[i].is_some() {
                // No notification follows: the buffer is free now.
                finished.push((i, res, false));
            }
        }
        for (i, r, copied) in finished {
            let Some((h, _)) = self.held[i].take() else {
                continue;
            };
            let pooled = matches!(h, HeldBuf::Pool(..));
            let buf = self.release_with(i, h, r < 0 && keep == Some(i));
            done.push(ZcDone {
                slot: i,
                buf,
                pooled,
                copied,
                result: if r < 0 {
                    Err(io::Error::from_raw_os_error(-r))
                } else {
                    Ok(())
                },
            });
        }
    }

    /// Waits up to `timeout` for a completion, then reaps.
    pub fn wait(&mut self, timeout: Duration, done: &mut Vec<ZcDone>) -> io::Result<()> {
        if self.in_flight() > 0 && self.ring.completion().is_empty() {
            wait_cqe(&self.ring, Some(timeout))?;
        }
        self.reap(done);
        Ok(())
    }
}

/// `user_data` of the fixed-buffer probe send.
const PROBE_TAG: u64 = u64::MAX - 1;

impl Drop for ZcRing {
    fn drop(&mut self) {
        let deadline = Instant::now() + TEARDOWN_WAIT;
        let mut done = Vec::new();
        while self.in_flight() > 0 && Instant::now() < deadline {
            if self.wait(Duration::from_millis(50), &mut done).is_err() {
                break;
            }
        }
        // Buffers still held may still be read by the kernel: leak them,
        // and the pool with them when one of its buffers is among them.
        let mut pool_held = false;
        for h in self.held.iter_mut() {
            if let Some((HeldBuf::Pool(..), _)) = h {
                pool_held = true;
            }
            std::mem::forget(h.take());
        }
        if pool_held {
            std::mem::forget(self.pool.take());
        }
    }
}
