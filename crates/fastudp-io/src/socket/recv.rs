//! The receive path: `recvmmsg` into caller-owned buffers, control data
//! decoded into [`RecvMeta`], GRO trains split into datagrams.

use super::state::UdpState;
use crate::error::Error;
use crate::sys::{self, AddrBuf, InMeta, MAX_BATCH};
use crate::wire::cmsg::CmsgBuf;
use crate::wire::control::{decode_recv, EcnCodepoint};
use crate::wire::gro::Datagrams;
use std::io::IoSliceMut;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;

/// Metadata of one received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecvMeta {
    /// Who sent it (v4-mapped on a dual-stack socket for IPv4 peers).
    pub source: SocketAddr,
    /// The address it was sent to (PKTINFO), when available.
    pub destination: Option<IpAddr>,
    /// Its ECN codepoint, when ECN is on and the mark was set.
    pub ecn: Option<EcnCodepoint>,
    /// Bytes of payload in the buffer.
    pub len: usize,
    /// Size of each datagram in the message (the GRO segment size); equal
    /// to `len` for a single datagram.
    pub stride: usize,
    /// `MSG_TRUNC`: the message was larger than the buffer and its tail
    /// was lost.
    pub truncated: bool,
    /// `MSG_CTRUNC`: some control data did not fit and was lost.
    pub control_truncated: bool,
    /// The interface the message arrived on, when PKTINFO is on.
    pub ifindex: Option<u32>,
    /// The socket's drop counter when this message was queued
    /// (`SO_RXQ_OVFL`: messages the kernel dropped on this socket so far; a
    /// dropped GRO train counts once), when the kernel reports it. It
    /// feeds [`crate::Stats::kernel_drops`].
    pub(crate) kernel_drops: Option<u32>,
}

impl Default for RecvMeta {
    /// An empty message from `0.0.0.0:0`, to be overwritten by a receive.
    fn default() -> Self {
        RecvMeta {
            source: SocketAddr::from(([0, 0, 0, 0], 0)),
            destination: None,
            ecn: None,
            len: 0,
            stride: 1,
            truncated: false,
            control_truncated: false,
            ifindex: None,
            kernel_drops: None,
        }
    }
}

impl RecvMeta {
    /// Splits a message's payload into its datagrams; the iterator's
    /// `len()` is their number.
    pub fn datagrams<'a>(&self, payload: &'a [u8]) -> Datagrams<'a> {
        Datagrams::split(payload, self.stride)
    }
}

/// Default bytes per message: room for a 64-segment GRO train of 1500-byte
/// MTU datagrams (64 x 1472 = 94208), above the 65535 of one datagram.
pub(crate) const DEFAULT_MESSAGE_CAPACITY: usize = 96 * 1024;

/// Default bytes one receive call may fill: the batch asks the kernel for
/// as many messages as the recent message size says fit in this, so that
/// the buffers written and then read stay in the CPU's cache.
pub(crate) const DEFAULT_RECV_BUDGET: usize = 256 * 1024;

/// Backlog, in messages per call, from which [`RecvBatch`] asks for more
/// than one message at a time (see [`RecvBatch::next_request`]).
const BATCH_BACKLOG: usize = 3;

/// Message size from which [`RecvBatch`] asks for at least two messages
/// whatever the backlog: a failed try is cheap next to a GRO train.
const BATCH_MESSAGE_BYTES: usize = 16 * 1024;

/// Reusable receive buffers for [`UdpIo::recv`](crate::UdpIo::recv): everything a receive
/// needs, allocated once, so that receiving allocates nothing.
///
/// The batch is *adaptive*: each call asks for as many messages as fit in
/// its byte budget (256 KiB by default) at the size of recent
/// messages, and never more than its capacity. Large GRO trains are
/// received a few at a time into buffers that stay warm in cache; small
/// datagrams in full batches. A call for one message uses `recvmsg`.
#[derive(Debug)]
pub struct RecvBatch {
    buf: Vec<u8>,
    stride: usize,
    controls: Vec<CmsgBuf>,
    names: Vec<AddrBuf>,
    raw: Vec<InMeta>,
    metas: Vec<RecvMeta>,
    len: usize,
    policy: RecvPolicy,
}

/// How many messages the next receive asks for (see
/// [`RecvBatch::next_request`]), from what recent receives got.
#[derive(Debug, Clone)]
pub(crate) struct RecvPolicy {
    budget: usize,
    /// Recent bytes per message, as a moving average.
    avg: usize,
    /// Messages recent calls for more than one got (the backlog they
    /// found), as a moving average in 16ths.
    backlog16: usize,
    /// Calls made, for the occasional probe of a larger batch.
    calls: usize,
}

impl Default for RecvPolicy {
    fn default() -> Self {
        RecvPolicy {
            budget: DEFAULT_RECV_BUDGET,
            avg: 0,
            backlog16: 0,
            calls: 0,
        }
    }
}

impl RecvPolicy {
    /// Messages to ask for, out of `cap`.
    pub(crate) fn next_request(&self, cap: usize) -> usize {
        if self.budget == 0 || self.avg == 0 {
            return cap;
        }
        let by_bytes = (self.budget / self.avg).clamp(1, cap);
        let by_count = if self.calls % 16 == 0 {
            cap
        } else if self.backlog16 >= BATCH_BACKLOG * 16 || self.avg >= BATCH_MESSAGE_BYTES {
            (self.backlog16 * 2).div_ceil(16).max(2)
        } else {
            1
        };
        by_bytes.min(by_count)
    }

    /// Notes what a receive that asked for `asked` messages got.
    pub(crate) fn note(&mut self, asked: usize, got: usize, bytes: usize) {
        if got == 0 {
            return;
        }
        self.calls = self.calls.wrapping_add(1);
        // A call for one message says nothing about the backlog.
        if asked > 1 {
            self.backlog16 = if self.backlog16 == 0 {
                got * 16
            } else {
                (self.backlog16 + got * 16) / 2
            };
        }
        let per = (bytes / got).max(1);
        // An average over about four calls: quick to follow a change of
        // traffic, steady under a mix.
        self.avg = if self.avg == 0 {
            per
        } else {
            (self.avg * 3 + per) / 4
        }
        .max(1);
    }
}

impl RecvBatch {
    /// Buffers for up to `messages` messages (1 to 128) of 96 KiB each:
    /// room for a 64-segment GRO train of 1472-byte datagrams (a 1500-byte
    /// MTU), so that no train is truncated.
    pub fn new(messages: usize) -> Self {
        let messages = messages.clamp(1, MAX_BATCH);
        let stride = DEFAULT_MESSAGE_CAPACITY;
        Self::with_buffer(vec![0; messages * stride], messages, stride)
    }

    /// Buffers for up to `messages` messages (1 to 128) of
    /// `bytes_per_message` bytes each (1 byte to 16 MiB), or an error when
    /// the allocator cannot give them (up to 2 GiB at the largest sizes),
    /// instead of an abort of the process: for hosts with a memory limit,
    /// and for C callers.
    ///
    /// A message larger than that is truncated, flagged
    /// ([`RecvMeta::truncated`]) and counted. With GRO on, less than the
    /// 96 KiB of [`RecvBatch::new`] may truncate trains: a truncated train
    /// yields only its whole datagrams, but a buffer shorter than one
    /// datagram yields that datagram's head, still flagged truncated.
    pub fn with_capacity(messages: usize, bytes_per_message: usize) -> Result<Self, Error> {
        let messages = messages.clamp(1, MAX_BATCH);
        let stride = bytes_per_message.clamp(1, 16 << 20);
        let bytes = messages * stride;
        let buf = crate::sys::try_zeroed_bytes(bytes).ok_or(crate::error::AllocError { bytes })?;
        Ok(Self::with_buffer(buf, messages, stride))
    }

    /// A batch around `buf` (`messages * stride` bytes). The other vectors
    /// are at most 128 small entries each.
    fn with_buffer(buf: Vec<u8>, messages: usize, stride: usize) -> Self {
        let empty = RecvMeta::default();
        RecvBatch {
            buf,
            stride,
            controls: vec![CmsgBuf::default(); messages],
            names: vec![AddrBuf::default(); messages],
            raw: vec![InMeta::default(); messages],
            metas: vec![empty; messages],
            len: 0,
            policy: RecvPolicy::default(),
        }
    }

    /// Sets the byte budget of one receive call (see the type's docs); 0
    /// turns the adaptation off, and every call asks for the full capacity.
    #[cfg(test)]
    pub(crate) fn with_budget(mut self, bytes: usize) -> Self {
        self.policy.budget = bytes;
        self
    }

    /// Messages the next receive asks for.
    ///
    /// A `recvmmsg` that gets fewer messages than it asked for pays for one
    /// failed try, and on a receiver that keeps up (one or two messages
    /// queued per call) that costs more per byte than the calls it saves:
    /// measured 1.10-1.18x the CPU per byte of plain `recvmsg`
    /// (docs/BENCHMARKS.md). So the batch asks for one message (`recvmsg`)
    /// unless the backlog that recent batch calls found is at least
    /// three messages, or messages are GRO trains (16 KiB or more on
    /// average); then about twice that backlog, and at least two. Every 16th call
    /// asks for a full batch, to find a backlog. Never more than fit the
    /// byte budget at the recent message size, or the capacity.
    pub(crate) fn next_request(&self) -> usize {
        self.policy.next_request(self.capacity())
    }

    /// Messages received by the last receive.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the last receive got nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Message metadata slots, for a receive that fills them itself; the
    /// batch then holds no messages of its own.
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub(crate) fn metas_for_view(&mut self) -> &mut [RecvMeta] {
        self.len = 0;
        &mut self.metas
    }

    /// Capacity in messages.
    pub fn capacity(&self) -> usize {
        self.metas.len()
    }

    /// Message `i`: its metadata and payload.
    pub fn get(&self, i: usize) -> Option<(&RecvMeta, &[u8])> {
        (i < self.len).then(|| {
            let m = &self.metas[i];
            (m, &self.buf[i * self.stride..i * self.stride + m.len])
        })
    }

    /// Every datagram of every message, with its message's metadata. To
    /// walk the messages themselves (a GRO train as one buffer), iterate
    /// over `&batch`.
    pub fn datagrams(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> + '_ {
        self.into_iter()
            .flat_map(|(m, buf)| m.datagrams(buf).map(move |d| (m, d)))
    }
}

/// The messages received by the last receive, each with its metadata and
/// payload (a GRO train is one message; [`RecvBatch::datagrams`] splits
/// them).
impl<'a> IntoIterator for &'a RecvBatch {
    type Item = (&'a RecvMeta, &'a [u8]);
    #[allow(clippy::type_complexity)]
    type IntoIter = std::iter::Map<
        std::iter::Zip<std::slice::Iter<'a, RecvMeta>, std::slice::ChunksExact<'a, u8>>,
        fn((&'a RecvMeta, &'a [u8])) -> (&'a RecvMeta, &'a [u8]),
    >;

    fn into_iter(self) -> Self::IntoIter {
        fn payload<'a>((m, slot): (&'a RecvMeta, &'a [u8])) -> (&'a RecvMeta, &'a [u8]) {
            (m, &slot[..m.len])
        }
        self.metas[..self.len]
            .iter()
            .zip(self.buf.chunks_exact(self.stride))
            .map(payload as fn(_) -> _)
    }
}

impl UdpState {
    /// Receives from `sock` into `batch` (see [`crate::UdpIo::recv`]).
    pub(crate) fn recv_on(&self, sock: impl AsFd, batch: &mut RecvBatch) -> Result<usize, Error> {
        let fd = sock.as_fd();
        batch.len = 0;
        let stride = batch.stride;
        #[cfg(feature = "uring")]
        if let Some(b) = self.backend_for(fd) {
            let (buf, metas) = (&mut batch.buf, &mut batch.metas);
            let max = metas.len();
            let r = self.ring_recv(b, fd, max, &|_| stride, |i, m, p| {
                buf[i * stride..i * stride + p.len()].copy_from_slice(p);
                metas[i] = *m;
            });
            if let Some(r) = r {
                batch.len = *r.as_ref().unwrap_or(&0);
                return r;
            }
        }
        let want = if self.caps.supports(crate::Feature::Mmsg) {
            batch.next_request()
        } else {
            1
        };
        let mut retries = 0;
        let got = loop {
            match sys::recvmmsg(
                fd,
                &mut batch.buf,
                stride,
                &mut batch.controls,
                &mut batch.names,
                &mut batch.raw,
                want,
                0,
            ) {
                Ok(n) => break n,
                Err(e) => {
                    if retries < 4 && self.absorb_async_error(fd, &e) {
                        retries += 1;
                        continue;
                    }
                    return Err(Error::from(e));
                }
            }
        };
        self.c.recv_calls.fetch_add(1, Relaxed);
        self.c.recv_messages.fetch_add(got as u64, Relaxed);
        let mut bytes = 0;
        for i in 0..got {
            let raw: InMeta = batch.raw[i];
            let control = &batch.controls[i].0[..raw.control_len.min(batch.controls[i].0.len())];
            batch.metas[i] = self.decode(raw, control, stride);
            bytes += batch.metas[i].len;
        }
        batch.len = got;
        batch.policy.note(want, got, bytes);
        Ok(got)
    }

    /// Receives from `sock` into the caller's buffers (see
    /// [`crate::UdpIo::recv_slices`]).
    pub(crate) fn recv_slices_on(
        &self,
        sock: impl AsFd,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Result<usize, Error> {
        let fd = sock.as_fd();
        let n = bufs.len().min(meta.len());
        let n = if self.caps.supports(crate::Feature::Mmsg) {
            n
        } else {
            n.min(1)
        };
        if n == 0 {
            return Ok(0);
        }
        #[cfg(feature = "uring")]
        if let Some(b) = self.backend_for(fd) {
            let mut lens = [0usize; sys::MAX_BATCH];
            for (l, b) in lens.iter_mut().zip(bufs.iter()) {
                *l = b.len();
            }
            let r = self.ring_recv(b, fd, n.min(sys::MAX_BATCH), &|i| lens[i], |i, m, p| {
                bufs[i][..p.len()].copy_from_slice(p);
                meta[i] = *m;
            });
            if let Some(r) = r {
                return r;
            }
        }
        let mut retries = 0;
        loop {
            let (bufs, meta) = (&mut bufs[..n], &mut *meta);
            let mut lens = [0usize; sys::MAX_BATCH];
            for (l, b) in lens.iter_mut().zip(bufs.iter()) {
                *l = b.len();
            }
            let r = sys::recvmmsg_slices(fd, bufs, 0, |i, raw, control| {
                meta[i] = self.decode(raw, control, lens[i]);
            });
            match r {
                Ok(got) => {
                    self.c.recv_calls.fetch_add(1, Relaxed);
                    self.c.recv_messages.fetch_add(got as u64, Relaxed);
                    return Ok(got);
                }
                Err(e) => {
                    if retries < 4 && self.absorb_async_error(fd, &e) {
                        retries += 1;
                        continue;
                    }
                    return Err(Error::from(e));
                }
            }
        }
    }

    /// Receives through backend `b` (see `RingBackend::recv`), decoding
    /// each message's metadata as the syscall path does: `f(i, meta,
    /// payload)`.
    #[cfg(feature = "uring")]
    pub(crate) fn ring_recv(
        &self,
        b: &dyn crate::backend::RingBackend,
        fd: std::os::fd::BorrowedFd<'_>,
        max: usize,
        room: &dyn Fn(usize) -> usize,
        mut f: impl FnMut(usize, &RecvMeta, &[u8]),
    ) -> Option<Result<usize, Error>> {
        b.recv(self, fd, max, room, &mut |i, raw, control, payload| {
            let meta = self.decode(raw, control, payload.len());
            f(i, &meta, &payload[..meta.len]);
        })
    }

    /// Turns one received message's raw metadata and control data into a
    /// [`RecvMeta`], counting truncation and drops; `room` is the size of
    /// the buffer it landed in.
    pub(crate) fn decode(&self, raw: InMeta, control: &[u8], room: usize) -> RecvMeta {
        let ctl = decode_recv(control);
        let truncated = raw.flags & sys::MSG_TRUNC != 0;
        let control_truncated = raw.flags & sys::MSG_CTRUNC != 0 || ctl.is_err();
        let ctl = ctl.unwrap_or_default();
        if truncated {
            self.c.truncated.fetch_add(1, Relaxed);
        }
        if control_truncated {
            self.c.ctruncated.fetch_add(1, Relaxed);
        }
        if let Some(d) = ctl.drops {
            self.c.drops.fetch_max(d as u64, Relaxed);
        }
        if let Some(e) = ctl.ecn {
            self.c.ecn_marked.fetch_add(1, Relaxed);
            if e == EcnCodepoint::Ce {
                self.c.ecn_ce.fetch_add(1, Relaxed);
            }
        }
        let mut len = raw.len.min(room);
        // A truncated train ends in part of a datagram: keep whole ones.
        if truncated {
            if let Some(s) = ctl.stride.filter(|&s| s > 0 && s < len) {
                len -= len % s;
            }
        }
        RecvMeta {
            source: raw
                .source
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
            destination: ctl.dst_ip,
            ecn: ctl.ecn,
            len,
            stride: ctl.stride.unwrap_or(len).max(1).min(len.max(1)),
            truncated,
            control_truncated,
            ifindex: ctl.ifindex,
            kernel_drops: ctl.drops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests of the next `n` calls, each noted as getting `got`
    /// messages of `bytes` each (or what was asked, if fewer).
    fn run(b: &mut RecvBatch, n: usize, got: usize, bytes: usize) -> Vec<usize> {
        (0..n)
            .map(|_| {
                let want = b.next_request();
                let g = got.min(want);
                b.policy.note(want, g, g * bytes);
                want
            })
            .collect()
    }

    #[test]
    fn a_receiver_that_keeps_up_uses_recvmsg_and_probes_every_16th_call() {
        let mut b = RecvBatch::new(32);
        let asks = run(&mut b, 64, 1, 1472);
        let batched: Vec<usize> = asks.iter().copied().filter(|&w| w > 1).collect();
        assert_eq!(batched, vec![32; 4], "{asks:?}");
        // Two queued per call is still cheaper one by one.
        let asks = run(&mut b, 64, 2, 1472);
        assert_eq!(asks.iter().filter(|&&w| w > 1).count(), 4, "{asks:?}");
    }

    #[test]
    fn a_backlog_is_found_by_a_probe_and_read_in_batches() {
        let mut b = RecvBatch::new(32);
        run(&mut b, 20, 1, 100);
        let asks = run(&mut b, 40, 8, 100);
        // After the next probe finds 8, calls ask for about twice that.
        let probe = asks.iter().position(|&w| w == 32).unwrap();
        assert!(asks[probe + 1..].iter().all(|&w| w >= 9), "{asks:?}");
        // The backlog goes away: back to one message per call.
        let asks = run(&mut b, 40, 1, 100);
        assert!(
            asks[20..].iter().filter(|&&w| w == 1).count() >= 18,
            "{asks:?}"
        );
    }

    #[test]
    fn gro_trains_are_read_at_least_two_at_a_time_within_the_byte_budget() {
        let mut b = RecvBatch::new(32);
        let asks = run(&mut b, 40, 1, 64 * 1024);
        assert!(asks[1..].iter().all(|&w| w >= 2), "{asks:?}");
        assert!(asks[1..].iter().all(|&w| w <= 4), "{asks:?}");
        let mut off = RecvBatch::new(32).with_budget(0);
        assert!(run(&mut off, 20, 1, 64 * 1024).iter().all(|&w| w == 32));
    }
}
