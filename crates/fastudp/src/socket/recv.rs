//! The receive path: `recvmmsg` into caller-owned buffers, control data
//! decoded into [`RecvMeta`], GRO trains split into datagrams.

use super::state::UdpState;
use crate::error::Error;
use crate::sys::{self, AddrBuf, InMeta, MAX_BATCH};
use crate::wire::cmsg::CmsgBuf;
use crate::wire::control::{decode_recv, EcnCodepoint};
use crate::wire::gro::Datagrams;
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
}

impl RecvMeta {
    /// Number of datagrams in the message.
    pub fn datagram_count(&self) -> usize {
        if self.len == 0 {
            1
        } else {
            self.len.div_ceil(self.stride.max(1))
        }
    }

    /// Splits a message's payload into its datagrams.
    pub fn datagrams<'a>(&self, payload: &'a [u8]) -> Datagrams<'a> {
        Datagrams::new(payload, self.stride)
    }
}

/// Default bytes per message: room for a 64-segment GRO train of 1500-byte
/// MTU datagrams (64 x 1472 = 94208), above the 65535 of one datagram.
pub const DEFAULT_MESSAGE_CAPACITY: usize = 96 * 1024;

/// Default bytes one receive call may fill: the batch asks the kernel for
/// as many messages as the recent message size says fit in this, so that
/// the buffers written and then read stay in the CPU's cache.
pub const DEFAULT_RECV_BUDGET: usize = 256 * 1024;

/// Reusable receive buffers for [`UdpState::recv`]: everything a receive
/// needs, allocated once, so that receiving allocates nothing.
///
/// The batch is *adaptive*: each call asks for as many messages as fit in
/// its byte budget ([`DEFAULT_RECV_BUDGET`]) at the size of recent
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
    budget: usize,
    /// Recent bytes per message, as a moving average.
    avg: usize,
    /// Recent messages per call, as a moving average in 16ths.
    got16: usize,
    /// Calls made, for the occasional probe of a larger batch.
    calls: usize,
}

impl RecvBatch {
    /// Buffers for up to `messages` messages of [`DEFAULT_MESSAGE_CAPACITY`]
    /// bytes.
    pub fn new(messages: usize) -> Self {
        Self::with_capacity(messages, DEFAULT_MESSAGE_CAPACITY)
    }

    /// Buffers for up to `messages` messages (1 to 128) of
    /// `bytes_per_message` bytes each (1 byte to 16 MiB).
    ///
    /// A message larger than that is truncated, flagged
    /// ([`RecvMeta::truncated`]) and counted. With GRO on, less than
    /// [`DEFAULT_MESSAGE_CAPACITY`] may truncate trains: a truncated train
    /// yields only its whole datagrams, but a buffer shorter than one
    /// datagram yields that datagram's head, still flagged truncated.
    pub fn with_capacity(messages: usize, bytes_per_message: usize) -> Self {
        let messages = messages.clamp(1, MAX_BATCH);
        let stride = bytes_per_message.clamp(1, 16 << 20);
        let empty = RecvMeta {
            source: SocketAddr::from(([0, 0, 0, 0], 0)),
            destination: None,
            ecn: None,
            len: 0,
            stride: 1,
            truncated: false,
            control_truncated: false,
            ifindex: None,
        };
        RecvBatch {
            buf: vec![0; messages * stride],
            stride,
            controls: vec![CmsgBuf::default(); messages],
            names: vec![AddrBuf::default(); messages],
            raw: vec![InMeta::default(); messages],
            metas: vec![empty; messages],
            len: 0,
            budget: DEFAULT_RECV_BUDGET,
            avg: 0,
            got16: 0,
            calls: 0,
        }
    }

    /// Sets the byte budget of one receive call (see the type's docs); 0
    /// turns the adaptation off, and every call asks for the full capacity.
    pub fn with_budget(mut self, bytes: usize) -> Self {
        self.budget = bytes;
        self
    }

    /// Messages the next receive asks for: no more than fit the byte
    /// budget at the recent message size, and about twice what recent calls
    /// got, so that a receiver that keeps up (one message queued per call)
    /// makes one `recvmsg` instead of a `recvmmsg` that fails its last
    /// try; every 16th call asks for one more, to find a backlog.
    pub fn next_request(&self) -> usize {
        let cap = self.capacity();
        if self.budget == 0 || self.avg == 0 {
            return cap;
        }
        let by_bytes = (self.budget / self.avg).clamp(1, cap);
        let by_count = if self.got16 < 20 {
            1 + usize::from(self.calls % 16 == 0)
        } else {
            (self.got16 * 2).div_ceil(16).max(2)
        };
        by_bytes.min(by_count)
    }

    /// Notes what a receive got, for the next request.
    fn note(&mut self, got: usize, bytes: usize) {
        if got == 0 {
            return;
        }
        self.calls = self.calls.wrapping_add(1);
        self.got16 = if self.calls == 1 {
            got * 16
        } else {
            (self.got16 * 3 + got * 16) / 4
        };
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

    /// Messages received by the last receive.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the last receive got nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
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

    /// The messages received by the last receive.
    pub fn iter(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> + '_ {
        (0..self.len).filter_map(move |i| self.get(i))
    }

    /// Every datagram of every message, with its message's metadata.
    pub fn datagrams(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> + '_ {
        self.iter()
            .flat_map(|(m, buf)| Datagrams::new(buf, m.stride).map(move |d| (m, d)))
    }
}

impl UdpState {
    /// Receives a batch of messages from the caller's socket into `batch`
    /// and returns how many.
    ///
    /// On a blocking socket, waits until at least one message is there,
    /// then takes what else is queued without waiting; on a non-blocking
    /// one, returns `WouldBlock` when nothing is queued. With GRO, one
    /// message may hold many datagrams: see [`RecvMeta::datagrams`].
    /// Truncated messages are flagged in their [`RecvMeta`] and counted.
    ///
    /// An ICMP error for an earlier send makes the kernel fail the next
    /// receive; on an unconnected socket fastudp reads it into its error
    /// queue ([`UdpState::recv_error`]) and receives again, on a connected
    /// one it returns the error (such as `ECONNREFUSED`: the peer went
    /// away). `EINTR` is retried.
    pub fn recv(&self, sock: impl AsFd, batch: &mut RecvBatch) -> Result<usize, Error> {
        let fd = sock.as_fd();
        batch.len = 0;
        let stride = batch.stride;
        let want = if self.caps.mmsg {
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
                    return Err(Error::Io(e));
                }
            }
        };
        self.c.recv_calls.fetch_add(1, Relaxed);
        self.c.recv_messages.fetch_add(got as u64, Relaxed);
        let mut bytes = 0;
        for i in 0..got {
            let raw: InMeta = batch.raw[i];
            let ctl =
                decode_recv(&batch.controls[i].0[..raw.control_len.min(batch.controls[i].0.len())]);
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
            let mut len = raw.len.min(stride);
            bytes += len;
            // A truncated train ends in part of a datagram: keep whole ones.
            if truncated {
                if let Some(s) = ctl.stride.filter(|&s| s > 0 && s < len) {
                    len -= len % s;
                }
            }
            batch.metas[i] = RecvMeta {
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
            };
        }
        batch.len = got;
        batch.note(got, bytes);
        Ok(got)
    }
}
