//! A worker's send side: the transmits of a loop turn, sent in as few
//! `sendmmsg` calls as the socket allows (large trains with
//! `MSG_ZEROCOPY`), `--total-rate`'s bucket, the bounded queue of
//! stateless replies, and the spare buffers.

use crate::limits::{SPARE_TRAINS, STATELESS_QUEUE};
use crate::stats::Counters;
use crate::{Error, SetupStep};
use fastudp_io::UdpIo;
use fastudp_io::{Config, EcnCodepoint, SendMeta, Socket, Transmit, ZeroCopySender};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Datagrams per GSO train at most: 40 of quinn-proto's largest (1452
/// bytes) fit the 64 KB a train may hold.
pub(crate) const MAX_TRAIN: usize = 40;
/// Trains at least this long go out with MSG_ZEROCOPY under --zerocopy.
pub(crate) const ZEROCOPY_MIN: usize = 16 * 1024;
/// The send socket's buffer, bytes.
pub(crate) const SEND_BUFFER: usize = 4 << 20;
/// Stateless replies wait while more than this many bytes of the send
/// socket's buffer are not yet sent (`SIOCOUTQ`; a slow link's qdisc holds
/// them): replies to a flood never put more than this in front of the
/// connections' own packets in the kernel's queue.
const STATELESS_OUTQ: usize = 128 << 10;

/// The most bytes `--total-rate` lets a worker send in one burst by
/// default: 16 kB, about what a shallow router buffer absorbs at once (the
/// batch size of `fastudp stream`'s user-space pacing).
pub(crate) const DEFAULT_BATCH_BYTES: usize = 16 * 1024;

/// One worker's send side.
pub(crate) struct Tx {
    /// The worker's send socket (non-blocking).
    pub(crate) socket: Socket,
    counters: Arc<Counters>,
    /// This turn's transmits (and those --total-rate held back): quinn-proto
    /// writes each into a buffer of its own, which is sent from there.
    pub(crate) pending: Vec<Pending>,
    /// --total-rate: the worker's share, bytes per second, and its tokens.
    pub(crate) pacer: Option<Bucket>,
    /// Large trains for the zerocopy sender.
    pub(crate) zc_pending: Vec<Pending>,
    /// The send socket's buffer was full at the last flush: what was not
    /// sent waits in `pending`, connections make no new transmits, and
    /// the worker tries again soon.
    pub(crate) blocked: bool,
    pub(crate) zc: Option<ZeroCopySender>,
    /// Train buffers to reuse.
    spare: Vec<Vec<u8>>,
    /// Stateless reply buffers to reuse.
    pub(crate) small_spare: Vec<Vec<u8>>,
    /// Stateless replies waiting to be sent (after `pending`), at most
    /// [`STATELESS_QUEUE`].
    pub(crate) stateless_q: Vec<Pending>,
    /// The last flush held the stateless replies back: more than
    /// [`STATELESS_OUTQ`] bytes waited in the kernel.
    pub(crate) stateless_held: bool,
    /// Datagrams per train at most.
    pub(crate) max_train: usize,
    /// The largest datagram queued so far (at least 1500): a train
    /// buffer is reserved for `max_train` of them, jumbo frames too.
    largest: usize,
    /// The allocation of the transmits list `send_queue` hands the
    /// socket, kept empty between calls.
    ts_spare: Vec<Transmit<'static>>,
    /// The worker's test harness: `flush` sends nothing, so that every
    /// transmit stays queued for the harness to carry (a flush in the
    /// middle of a turn, at `limits::PENDING_TRAINS`, would otherwise send to
    /// the real socket what the harness's virtual clients wait for).
    #[cfg(test)]
    pub(crate) hold: bool,
}

impl Tx {
    /// When --total-rate's tokens let the queued transmits go; `None` when
    /// nothing waits for them (no rate, or nothing queued).
    pub(crate) fn paced_until(&self) -> Option<Instant> {
        let queued = !self.pending.is_empty() || !self.stateless_q.is_empty();
        self.pacer
            .as_ref()
            .filter(|_| queued)
            .map(Bucket::positive_at)
    }

    /// The send side of a worker on `socket` (made non-blocking: a full
    /// send buffer must not stop the worker's receives and timers; the
    /// tail waits in `pending` instead), with `rate` bytes/s of
    /// --total-rate's sent in bursts of at most `burst` bytes, and trains of
    /// at most `max_train` datagrams.
    pub(crate) fn new(
        socket: Socket,
        zc: Option<ZeroCopySender>,
        counters: Arc<Counters>,
        rate: Option<f64>,
        burst: usize,
        max_train: usize,
    ) -> Result<Self, Error> {
        socket
            .as_std()
            .set_nonblocking(true)
            .map_err(|source| Error::Setup {
                step: SetupStep::SendSocket(
                    socket
                        .as_std()
                        .local_addr()
                        .unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0))),
                ),
                source,
            })?;
        let mut max_train = socket
            .max_gso_segments()
            .clamp(1, max_train.clamp(1, crate::MAX_TRAIN_LIMIT));
        if rate.is_some() {
            // A train is one burst: no longer than a batch.
            max_train = max_train.clamp(1, (burst / 1452).max(1));
        }
        Ok(Tx {
            socket,
            counters,
            pending: Vec::new(),
            pacer: rate.map(|r| Bucket::new(r, burst)),
            zc_pending: Vec::new(),
            blocked: false,
            zc,
            spare: Vec::new(),
            small_spare: Vec::new(),
            stateless_q: Vec::new(),
            stateless_held: false,
            max_train,
            largest: 1500,
            ts_spare: Vec::new(),
            #[cfg(test)]
            hold: false,
        })
    }

    /// Queues a stateless reply, unless [`STATELESS_QUEUE`] of them wait
    /// already and a flush cannot send them (the send socket is full):
    /// then the reply is dropped and counted.
    pub(crate) fn stateless(&mut self, t: &quinn_proto::Transmit, buf: Vec<u8>) {
        // Once per turn at most the socket is found full: a flood of
        // triggers then costs no send call each.
        if self.stateless_q.len() >= STATELESS_QUEUE && !self.blocked && !self.stateless_held {
            self.flush();
        }
        if self.stateless_q.len() >= STATELESS_QUEUE {
            self.counters.stateless_dropped.fetch_add(1, Relaxed);
            keep_spare(&mut self.small_spare, buf, STATELESS_QUEUE);
            return;
        }
        let mut p = Pending::new(t, buf, None);
        p.stateless = true;
        self.stateless_q.push(p);
    }

    /// A cleared buffer, reused where one is spare.
    pub(crate) fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        // Room for the largest train, so that quinn-proto never grows
        // (and so copies) it: `max_train` of the largest datagram seen
        // (1500 bytes until a larger one, after path-MTU discovery on
        // jumbo frames, was queued).
        b.reserve(self.max_train * self.largest);
        b
    }

    /// Keeps a buffer for reuse (up to a bound).
    pub(crate) fn give_buf(&mut self, b: Vec<u8>) {
        keep_spare(&mut self.spare, b, SPARE_TRAINS);
    }

    /// Gives back a sent (or dropped) transmit's buffer.
    fn done_with(&mut self, p: Pending) {
        if p.stateless {
            keep_spare(&mut self.small_spare, p.buf, STATELESS_QUEUE);
        } else {
            keep_spare(&mut self.spare, p.buf, SPARE_TRAINS);
        }
    }

    /// Queues a transmit, in its buffer, for the end of the turn.
    pub(crate) fn queue(&mut self, t: &quinn_proto::Transmit, buf: Vec<u8>, txtime: Option<u64>) {
        let datagram = t.segment_size.unwrap_or(t.size).min(u16::MAX as usize);
        self.largest = self.largest.max(datagram);
        self.pending.push(Pending::new(t, buf, txtime));
    }

    /// Sends this turn's transmits: the batch in as few calls as the
    /// socket allows, large trains with zerocopy.
    pub(crate) fn flush(&mut self) {
        #[cfg(test)]
        if self.hold {
            return;
        }
        self.blocked = false;
        // Connections' transmits first, stateless replies after: a flood
        // that fills the send path with replies must not hold back the
        // handshakes and responses of real clients.
        let mut q = std::mem::take(&mut self.pending);
        self.send_queue(&mut q);
        self.pending = q;
        // Stateless replies only while the kernel's queue is short, so
        // that a flood's replies do not delay real clients' packets there.
        self.stateless_held = !self.stateless_q.is_empty()
            && self.socket.unsent_bytes().is_ok_and(|n| n > STATELESS_OUTQ);
        if !self.blocked && !self.stateless_held {
            let mut q = std::mem::take(&mut self.stateless_q);
            self.send_queue(&mut q);
            self.stateless_q = q;
        }
        if let Some(zc) = self.zc.as_mut() {
            let mut kept = Vec::new();
            for p in self.zc_pending.drain(..) {
                if self.blocked {
                    kept.push(p);
                    continue;
                }
                let (len, segs) = (
                    p.len as u64,
                    p.segment.map_or(1, |s| p.len.div_ceil(s)) as u64,
                );
                if let Some(b) = self.pacer.as_mut() {
                    b.tokens -= len as f64;
                }
                let meta = SendMeta::default()
                    .with_ecn(p.ecn)
                    .with_src_ip(p.src_ip)
                    .with_txtime(p.txtime);
                match zc.send(&self.socket, p.dest, p.buf, p.segment, meta) {
                    Ok(()) => {
                        self.counters.wire_bytes.fetch_add(len, Relaxed);
                        self.counters.datagrams_sent.fetch_add(segs, Relaxed);
                    }
                    Err((e, buf)) if send_buffer_full(&e) => {
                        // Kept, whole, for the next try (nothing of it
                        // went out: a cut train is an error of its own).
                        self.blocked = true;
                        kept.push(Pending { buf, ..p });
                    }
                    Err((_, b)) => {
                        self.counters.send_errors.fetch_add(1, Relaxed);
                        keep_spare(&mut self.spare, b, SPARE_TRAINS);
                    }
                }
            }
            self.zc_pending = kept;
            let _ = zc.reap(&self.socket);
            while let Some(b) = zc.pop_done() {
                keep_spare(&mut self.spare, b, SPARE_TRAINS);
            }
        }
    }

    /// Sends what `q` holds, in as few calls as the socket allows, as far
    /// as --total-rate's tokens and the socket's buffer let it; what went
    /// out leaves `q` (a cut train keeps its rest at the front).
    fn send_queue(&mut self, q: &mut Vec<Pending>) {
        // With --total-rate, what the tokens allow: at least one transmit
        // once they are positive (a train may overdraw them).
        let n = match self.pacer.as_mut() {
            None => q.len(),
            Some(b) => {
                b.refill();
                let mut n = 0;
                for p in q.iter() {
                    if b.tokens <= 0.0 {
                        break;
                    }
                    b.tokens -= (p.len - p.start) as f64;
                    n += 1;
                }
                n
            }
        };
        if n > 0 {
            // The list's allocation is reused: an empty list of one
            // lifetime becomes one of another in place.
            let mut ts: Vec<Transmit<'_>> = relist(std::mem::take(&mut self.ts_spare));
            ts.extend(q[..n].iter().map(Pending::transmit));
            let mut at = 0;
            let mut dropped_locally = 0u64;
            while at < ts.len() {
                match self.socket.send(&ts[at..]) {
                    Ok(sent) if sent.transmits == 0 && sent.datagrams == 0 => {
                        self.blocked = true;
                        break;
                    }
                    Ok(sent) => {
                        // Fewer than all: the buffer filled (or the next
                        // transmit fails, which the next call says).
                        // Datagrams a full qdisc dropped are done: QUIC
                        // sees them lost and resends.
                        dropped_locally += sent.dropped_locally as u64;
                        at += sent.transmits;
                        if sent.datagrams > 0 {
                            ts[at] = ts[at].skip_datagrams(sent.datagrams);
                        }
                    }
                    Err(e) if send_buffer_full(&e) => {
                        self.blocked = true;
                        break;
                    }
                    Err(_) => {
                        // The first transmit is refused (and the library
                        // has said why in its stats); QUIC recovers it.
                        self.counters.send_errors.fetch_add(1, Relaxed);
                        at += 1;
                    }
                }
            }
            // What is left of the transmit at `at`, if a call cut it.
            let left = ts.get(at).map(|t| (t.contents.len(), t.segments()));
            self.ts_spare = relist(ts);
            // What went out: the whole transmits before `at`, and the front
            // of the one at `at`, which keeps only the rest.
            let (mut bytes, mut datagrams) = (0u64, 0u64);
            for p in &q[..at] {
                bytes += (p.len - p.start) as u64;
                datagrams += p.transmit().segments() as u64;
            }
            if let Some((len, segs)) = left {
                let p = &mut q[at];
                let cut = p.len - p.start - len;
                if cut > 0 {
                    bytes += cut as u64;
                    datagrams += (p.transmit().segments() - segs) as u64;
                    p.start += cut;
                }
            }
            // `wire_bytes` counts what the kernel was handed, datagrams its
            // queue then dropped included (their count is apart).
            let c = &self.counters;
            c.wire_bytes.fetch_add(bytes, Relaxed);
            c.datagrams_sent
                .fetch_add(datagrams.saturating_sub(dropped_locally), Relaxed);
            c.dropped_locally.fetch_add(dropped_locally, Relaxed);
            for p in q.drain(..at) {
                self.done_with(p);
            }
        }
    }
}

/// `v` emptied, as a list of transmits of another lifetime, in the same
/// allocation (std collects a `Vec`'s `into_iter` in place when the
/// element types have the same size and alignment, as these do).
fn relist<'a>(mut v: Vec<Transmit<'_>>) -> Vec<Transmit<'a>> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the list is empty"))
        .collect()
}

/// A transmit waiting for the end of the loop turn.
pub(crate) struct Pending {
    /// Its buffer.
    buf: Vec<u8>,
    /// Bytes of it already sent (whole datagrams of a train the socket
    /// took only part of before its buffer filled).
    start: usize,
    len: usize,
    dest: SocketAddr,
    segment: Option<usize>,
    ecn: Option<EcnCodepoint>,
    src_ip: Option<IpAddr>,
    txtime: Option<u64>,
    /// A stateless reply (counted against [`STATELESS_QUEUE`]).
    stateless: bool,
}

impl Pending {
    /// quinn-proto's transmit `t`, written into `buf`.
    pub(crate) fn new(t: &quinn_proto::Transmit, buf: Vec<u8>, txtime: Option<u64>) -> Self {
        Pending {
            buf,
            start: 0,
            len: t.size,
            dest: t.destination,
            segment: t.segment_size.filter(|&s| s < t.size),
            ecn: from_quinn_ecn(t.ecn),
            src_ip: t.src_ip,
            txtime,
            stateless: false,
        }
    }

    /// Where it goes (tests take it from the queue instead of the
    /// socket).
    #[cfg(test)]
    pub(crate) fn destination(&self) -> SocketAddr {
        self.dest
    }

    /// Its datagrams, what is left of them (tests take them from the
    /// queue instead of the socket).
    #[cfg(test)]
    pub(crate) fn datagrams(&self) -> Vec<&[u8]> {
        let c = &self.buf[self.start..self.len];
        c.chunks(self.segment.unwrap_or(c.len()).max(1)).collect()
    }

    /// What is left of it to send.
    fn transmit(&self) -> Transmit<'_> {
        let c = &self.buf[self.start..self.len];
        let t = match self.segment {
            Some(s) if s < c.len() => Transmit::train(self.dest, c, s),
            _ => Transmit::new(self.dest, c),
        };
        t.with_ecn(self.ecn)
            .with_src_ip(self.src_ip)
            .with_txtime(self.txtime)
    }
}

/// Keeps a buffer for reuse, up to `max` of them.
pub(crate) fn keep_spare(spare: &mut Vec<Vec<u8>>, b: Vec<u8>, max: usize) {
    if spare.len() < max {
        spare.push(b);
    }
}

/// The send socket's buffer is full (`EAGAIN`) or the kernel is short of
/// memory for it (`ENOBUFS` from zerocopy's optmem): nothing was sent, and
/// a later try will do. A full qdisc is not an error: the library reports
/// those datagrams done and dropped (`Sent::dropped_locally`), so QUIC
/// counts them sent and its loss recovery resends them, as after any loss
/// on the way (congestion).
fn send_buffer_full(e: &fastudp_io::Error) -> bool {
    e.kind() == fastudp_io::ErrorKind::Io
        && e.io_error().is_some_and(|io| {
            io.kind() == std::io::ErrorKind::WouldBlock || io.raw_os_error() == Some(libc::ENOBUFS)
        })
}

/// An unconnected send socket on `addr`, in the reuseport group after its
/// receive sockets (the steering program never picks it), with the
/// features `disabled` switches off.
pub(crate) fn send_socket(
    addr: SocketAddr,
    disabled: &[fastudp_io::Feature],
) -> Result<Socket, Error> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )
    .and_then(|s| {
        if addr.is_ipv6() {
            s.set_only_v6(false).ok();
        }
        s.set_reuse_port(true)?;
        s.bind(&addr.into())?;
        Ok(s)
    })
    .map_err(|source| Error::Setup {
        step: SetupStep::SendSocket(addr),
        source,
    })?;
    // The socket is non-blocking: a buffer that holds a whole turn's
    // trains of many connections keeps `EAGAIN` (and the retry calls
    // after it) rare (capped at net.core.wmem_max without CAP_NET_ADMIN).
    Socket::from_std(
        s.into(),
        Config::default()
            .send_buffer(SEND_BUFFER)
            .disable(disabled.iter().copied()),
    )
    .map_err(|e| Error::Setup {
        step: SetupStep::SendSocket(addr),
        source: e.into(),
    })
}

fn from_quinn_ecn(e: Option<quinn_proto::EcnCodepoint>) -> Option<EcnCodepoint> {
    e.and_then(|e| EcnCodepoint::from_bits(e as u8))
}

/// `--total-rate`'s token bucket: bytes a worker may send, refilled at its
/// rate, at most a burst ([`crate::Tuning::pacing_burst`]) ahead, so that the worker's
/// connections together leave no faster than the rate and in bursts no
/// larger than that: what a shallow bottleneck queue takes.
pub(crate) struct Bucket {
    /// Bytes per second.
    rate: f64,
    tokens: f64,
    /// The most tokens it holds, bytes.
    burst: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: f64, burst: usize) -> Self {
        Bucket {
            rate: rate.max(1.0),
            tokens: burst as f64,
            burst: burst as f64,
            last: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.burst);
        self.last = now;
    }

    /// When the tokens are positive again.
    pub(crate) fn positive_at(&self) -> Instant {
        if self.tokens > 0.0 {
            return self.last;
        }
        self.last + Duration::from_secs_f64((1.0 - self.tokens) / self.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transmit_list_keeps_its_allocation() {
        let bytes = [7u8; 10];
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut v = Vec::with_capacity(8);
        v.push(Transmit::new(to, &bytes));
        let (at, cap) = (v.as_ptr() as usize, v.capacity());
        let w: Vec<Transmit<'static>> = relist(v);
        assert!(w.is_empty());
        assert_eq!((w.as_ptr() as usize, w.capacity()), (at, cap));
    }

    #[test]
    fn train_buffers_have_room_for_jumbo_trains() {
        let sock = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let mut tx = Tx::new(sock, None, Arc::default(), None, 0, 4).unwrap();
        tx.hold = true;
        let n = tx.max_train;
        assert!(tx.take_buf().capacity() >= n * 1500);
        // A train of 8,952-byte datagrams (a 9,000-byte MTU) was queued.
        let t = quinn_proto::Transmit {
            destination: "127.0.0.1:9".parse().unwrap(),
            ecn: None,
            size: 2 * 8952,
            segment_size: Some(8952),
            src_ip: None,
        };
        tx.queue(&t, vec![0; 2 * 8952], None);
        assert!(tx.take_buf().capacity() >= n * 8952);
    }
}
