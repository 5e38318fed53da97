//! A sender for callers that produce one datagram at a time.

use crate::error::Error;
use crate::socket::send::Source;
use crate::socket::{Transmit, UdpIo};
use crate::wire::control::EcnCodepoint;
use crate::wire::plan::{Limits, TrainBuilder};
use std::io;
use std::net::{IpAddr, SocketAddr};

/// Default path MTU assumed when packing trains: 1500 bytes, so segments are
/// at most 1472 (IPv4) or 1452 (IPv6) bytes. [`Coalescer::set_mtu`] sets
/// another.
const DEFAULT_MTU: usize = 1500;

#[derive(Debug, Clone, Copy)]
struct Queued {
    dest: SocketAddr,
    ecn: Option<EcnCodepoint>,
    src_ip: Option<IpAddr>,
    start: usize,
    end: usize,
    segment_size: usize,
    count: usize,
    /// Number (as `push` returned it) of the train's first datagram.
    first: u64,
}

impl Queued {
    fn transmit<'a>(&self, buf: &'a [u8]) -> Transmit<'a> {
        Transmit {
            segment_size: (self.count > 1).then_some(self.segment_size),
            ecn: self.ecn,
            src_ip: self.src_ip,
            ..Transmit::new(self.dest, &buf[self.start..self.end])
        }
    }
}

/// The queue as the send engine reads it.
struct View<'a> {
    trains: &'a [Queued],
    buf: &'a [u8],
}

impl<'a> Source<'a> for View<'a> {
    fn count(&self) -> usize {
        self.trains.len()
    }
    fn get(&self, i: usize) -> Transmit<'a> {
        self.trains[i].transmit(self.buf)
    }
}

/// Packs datagrams pushed one at a time into GSO trains and sends them in as
/// few `sendmmsg` calls as it can.
///
/// Consecutive datagrams of equal size to the same destination (with the
/// same ECN mark and source) share a train, within every kernel limit:
/// the socket's segment count, 65507 / 65527 bytes per send and a segment
/// size that fits the path MTU. A shorter datagram ends a train.
///
/// It holds no socket: each call takes one ([`UdpIo`]: a [`crate::Socket`],
/// or `(&state, &socket)`), so it can live in the same struct as its
/// socket. Use it with one socket. After warm-up, `push` and `flush`
/// allocate nothing.
#[derive(Debug)]
pub struct Coalescer {
    buf: Vec<u8>,
    trains: Vec<Queued>,
    builder: TrainBuilder,
    mtu: usize,
    max_trains: usize,
    queued: usize,
    next: u64,
}

impl Default for Coalescer {
    fn default() -> Self {
        Self::new()
    }
}

impl Coalescer {
    /// A coalescer queueing up to 64 trains before it flushes, for a path
    /// MTU of 1500 bytes (see [`Coalescer::set_mtu`]).
    pub fn new() -> Self {
        Coalescer {
            buf: Vec::with_capacity(64 * 1024),
            trains: Vec::with_capacity(64),
            builder: TrainBuilder::new(Limits::new(1, false, DEFAULT_MTU)),
            mtu: DEFAULT_MTU,
            max_trains: 64,
            queued: 0,
            next: 0,
        }
    }

    /// Sets the path MTU that bounds the segment size (default 1500 bytes),
    /// at the start or later (say, after an ICMP "packet too big", see
    /// [`crate::SocketErrorKind::PacketTooBig`]). Queued trains whose segments
    /// no longer fit are re-planned: their datagrams go one by one.
    pub fn set_mtu(&mut self, mtu: usize) {
        let shrank = mtu < self.mtu;
        self.mtu = mtu;
        self.builder.take();
        if shrank {
            self.split_trains(|q, limit_v4, limit_v6| {
                let max = if q.dest.is_ipv6() && !is_mapped(&q.dest) {
                    limit_v6
                } else {
                    limit_v4
                };
                q.count > 1 && q.segment_size > max
            });
        }
    }

    /// The path MTU in force.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Sets how many trains are queued before a push flushes them.
    pub fn with_max_trains(mut self, n: usize) -> Self {
        self.max_trains = n.max(1);
        // The queue grows as trains come: reserving a caller's huge bound
        // up front would abort the process.
        self.trains.reserve(self.max_trains.min(1024));
        self
    }

    /// What is queued and not yet sent: `(datagrams, trains)`.
    pub fn queued(&self) -> (usize, usize) {
        (self.queued, self.trains.len())
    }

    /// True when nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.trains.is_empty()
    }

    /// Queues one datagram to `dest`, with an ECN mark and a source address
    /// if given (`None, None` for neither), and returns its number:
    /// datagrams are numbered 0, 1, 2, ... in push order, and errors name
    /// them so.
    ///
    /// When the queue is full, the queued trains are flushed first. An error
    /// means the datagram was *not* queued (the caller still has it): an
    /// oversized payload, or a flush that could not make room
    /// (`WouldBlock` on a non-blocking socket, or the flush's error).
    pub fn push(
        &mut self,
        sock: &impl UdpIo,
        dest: SocketAddr,
        data: &[u8],
        ecn: Option<EcnCodepoint>,
        src_ip: Option<IpAddr>,
    ) -> Result<u64, Error> {
        let state = sock.state();
        let number = self.next;
        // Whatever the socket would refuse is refused here, before it can
        // sit in the queue and block everything behind it.
        let t = Transmit {
            ecn,
            src_ip,
            ..Transmit::new(dest, data)
        };
        state.validate(number as usize, &t)?;
        // Room first, so that a failed allocation leaves the queue as it
        // was (and is an error, not an abort).
        let no_room = |bytes| {
            Error::from(crate::error::Detail::Alloc {
                index: number as usize,
                source: crate::error::AllocError { bytes },
            })
        };
        self.buf
            .try_reserve(data.len())
            .map_err(|_| no_room(data.len()))?;
        self.trains
            .try_reserve(1)
            .map_err(|_| no_room(std::mem::size_of::<Queued>()))?;
        let joins = match self.trains.last() {
            Some(t)
                if !self.builder.is_empty()
                    && t.dest == dest
                    && t.ecn == ecn
                    && t.src_ip == src_ip =>
            {
                self.builder.offer(data.len()).unwrap_or(false)
            }
            _ => false,
        };
        if !joins {
            if self.trains.len() >= self.max_trains {
                self.flush(sock)?;
                if !self.is_empty() {
                    return Err(Error::from(io::Error::from(io::ErrorKind::WouldBlock)));
                }
            }
            self.builder.take();
            let ipv6 = dest.is_ipv6() && !is_mapped(&dest);
            self.builder
                .set_limits(Limits::new(state.max_gso_segments(), ipv6, self.mtu));
            self.builder.offer(data.len()).map_err(|o| {
                Error::from(crate::error::Detail::PayloadTooLarge {
                    index: number as usize,
                    len: o.len,
                    max: o.max,
                })
            })?;
            let at = self.buf.len();
            self.trains.push(Queued {
                dest,
                ecn,
                src_ip,
                start: at,
                end: at,
                segment_size: data.len(),
                count: 0,
                first: number,
            });
        }
        self.buf.extend_from_slice(data);
        let t = self.trains.last_mut().expect("a train is open");
        t.end = self.buf.len();
        t.count += 1;
        self.queued += 1;
        self.next += 1;
        Ok(number)
    }

    /// Sends every queued train. Returns the number of datagrams sent.
    /// Datagrams the local queue dropped (`ENOBUFS`, see
    /// [`crate::UdpIo::send`]) leave the queue as done, are not in that
    /// number, and are counted in [`crate::Stats::dropped_locally`].
    ///
    /// On a non-blocking socket the kernel may take only some: the rest stay
    /// queued, in order, for the next flush. An error means nothing was sent
    /// and everything is still queued, with one exception: a datagram that
    /// does not fit the path MTU on its own
    /// ([`ErrorKind::ExceedsPathMtu`](crate::ErrorKind::ExceedsPathMtu),
    /// whose [`Error::transmit_index`] is the datagram's number from `push`) is taken out of the queue and handed back to the
    /// caller through that error, so that the rest can go; and the MTU is
    /// lowered below its size. A train whose segments no longer fit
    /// (after the path MTU shrank) is
    /// re-planned one datagram at a time and sent again at once.
    pub fn flush(&mut self, sock: &impl UdpIo) -> Result<usize, Error> {
        self.builder.take();
        let mut total = 0;
        let mut replans = 0;
        while !self.trains.is_empty() {
            let r = sock.state().send_from(
                sock.fd(),
                &View {
                    trains: &self.trains,
                    buf: &self.buf,
                },
            );
            match r.map_err(|e| (e.detail().mtu_refusal(), e)) {
                Ok(sent) => {
                    // Datagrams a full local queue dropped are done too.
                    total += self.consume(sent.transmits, sent.datagrams) - sent.dropped_locally;
                    if !self.trains.is_empty() {
                        break;
                    }
                }
                Err((Some((index, None)), _)) if replans < 2 => {
                    // The path MTU shrank under queued trains: the train goes
                    // one datagram at a time, and any that does not fit is
                    // reported on its own.
                    replans += 1;
                    self.split_train(index);
                }
                Err((Some((index, Some(destination))), _)) if total == 0 => {
                    let q = self.trains[index];
                    let len = q.end - q.start;
                    self.remove_train(index);
                    self.set_mtu(self.mtu.min(len + header(&destination)).saturating_sub(1));
                    return Err(Error::from(crate::error::Detail::DatagramExceedsMtu {
                        index: q.first as usize,
                        len,
                        destination,
                    }));
                }
                Err(_) if total > 0 => break,
                Err((_, e)) => return Err(e),
            }
        }
        if self.trains.is_empty() {
            self.buf.clear();
        }
        Ok(total)
    }

    /// Drops what went out: `trains` whole trains, then `datagrams` of the
    /// next. Returns the datagrams dropped.
    fn consume(&mut self, trains: usize, datagrams: usize) -> usize {
        let whole: usize = self.trains[..trains].iter().map(|t| t.count).sum();
        self.trains.drain(..trains);
        let mut n = whole;
        if datagrams > 0 {
            if let Some(t) = self.trains.first_mut() {
                let k = datagrams.min(t.count);
                t.start = (t.start + k * t.segment_size).min(t.end);
                t.count -= k;
                t.first += k as u64;
                n += k;
                if t.count == 0 {
                    self.trains.remove(0);
                }
            }
        }
        self.queued -= n;
        n
    }

    /// Takes train `i` out of the queue, unsent.
    fn remove_train(&mut self, i: usize) {
        let q = self.trains.remove(i);
        self.queued -= q.count;
    }

    /// Re-plans train `i` as one train per datagram; returns how many
    /// trains it became.
    fn split_train(&mut self, i: usize) -> usize {
        let q = self.trains[i];
        if q.count <= 1 {
            return 1;
        }
        let singles = (0..q.count).map(|j| {
            let start = q.start + j * q.segment_size;
            Queued {
                start,
                end: (start + q.segment_size).min(q.end),
                count: 1,
                first: q.first + j as u64,
                ..q
            }
        });
        self.trains.splice(i..=i, singles);
        q.count
    }

    /// Re-plans every train for which `pick(train, max_v4, max_v6)` says so
    /// as one train per datagram.
    fn split_trains(&mut self, mut pick: impl FnMut(&Queued, usize, usize) -> bool) {
        let v4 = crate::wire::max_segment_for_mtu(self.mtu, false);
        let v6 = crate::wire::max_segment_for_mtu(self.mtu, true);
        let mut i = 0;
        while i < self.trains.len() {
            i += if pick(&self.trains[i], v4, v6) {
                self.split_train(i)
            } else {
                1
            };
        }
    }
}

fn is_mapped(d: &SocketAddr) -> bool {
    matches!(d, SocketAddr::V6(v6) if v6.ip().to_ipv4_mapped().is_some())
}

/// IP and UDP header bytes to `d`.
fn header(d: &SocketAddr) -> usize {
    if d.is_ipv6() && !is_mapped(d) {
        crate::wire::HEADER_V6
    } else {
        crate::wire::HEADER_V4
    }
}
