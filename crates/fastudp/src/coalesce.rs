//! A sender for callers that produce one datagram at a time.

use crate::error::Error;
use crate::socket::{Socket, Transmit};
use crate::wire::control::EcnCodepoint;
use crate::wire::plan::{Limits, TrainBuilder};
use std::io;
use std::net::{IpAddr, SocketAddr};

/// Default path MTU assumed when packing trains: 1500 bytes, so segments are
/// at most 1472 (IPv4) or 1452 (IPv6) bytes. Set another with
/// [`Coalescer::with_mtu`].
pub const DEFAULT_MTU: usize = 1500;

#[derive(Debug, Clone, Copy)]
struct Queued {
    dest: SocketAddr,
    ecn: Option<EcnCodepoint>,
    src_ip: Option<IpAddr>,
    start: usize,
    end: usize,
    segment_size: usize,
    count: usize,
}

/// Packs datagrams pushed one at a time into GSO trains and sends them in as
/// few `sendmmsg` calls as it can.
///
/// Consecutive datagrams of equal size to the same destination (with the
/// same ECN mark and source) share a train, within every kernel limit:
/// the socket's segment count, 65507 / 65527 bytes per send and a segment
/// size that fits the path MTU. A shorter datagram ends a train.
#[derive(Debug)]
pub struct Coalescer<'s> {
    socket: &'s Socket,
    buf: Vec<u8>,
    trains: Vec<Queued>,
    builder: TrainBuilder,
    mtu: usize,
    max_trains: usize,
    queued: usize,
}

impl<'s> Coalescer<'s> {
    /// A coalescer for `socket`, queueing up to 64 trains before it flushes.
    pub fn new(socket: &'s Socket) -> Self {
        Coalescer {
            socket,
            buf: Vec::with_capacity(64 * 1024),
            trains: Vec::new(),
            builder: TrainBuilder::new(Limits::new(1, false, DEFAULT_MTU)),
            mtu: DEFAULT_MTU,
            max_trains: 64,
            queued: 0,
        }
    }

    /// Sets the path MTU that bounds the segment size.
    pub fn with_mtu(mut self, mtu: usize) -> Self {
        self.mtu = mtu;
        self
    }

    /// Sets how many trains are queued before a push flushes them.
    pub fn with_max_trains(mut self, n: usize) -> Self {
        self.max_trains = n.max(1);
        self
    }

    /// Datagrams queued and not yet sent.
    pub fn queued_datagrams(&self) -> usize {
        self.queued
    }

    /// Trains queued and not yet sent.
    pub fn queued_trains(&self) -> usize {
        self.trains.len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.trains.is_empty()
    }

    /// Queues one datagram to `dest`.
    ///
    /// When the queue is full, the queued trains are flushed first. An error
    /// means the datagram was *not* queued (the caller still has it): an
    /// oversized payload, or a flush that could not make room
    /// (`WouldBlock` on a non-blocking socket).
    pub fn push(&mut self, dest: SocketAddr, data: &[u8]) -> Result<(), Error> {
        self.push_with(dest, data, None, None)
    }

    /// Queues one datagram with an ECN mark and a source address.
    pub fn push_with(
        &mut self,
        dest: SocketAddr,
        data: &[u8],
        ecn: Option<EcnCodepoint>,
        src_ip: Option<IpAddr>,
    ) -> Result<(), Error> {
        // Whatever the socket would refuse is refused here, before it can
        // sit in the queue and block everything behind it.
        let t = Transmit {
            ecn,
            src_ip,
            ..Transmit::new(dest, data)
        };
        self.socket.validate(self.queued, &t)?;
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
                self.flush()?;
                if !self.is_empty() {
                    return Err(Error::Io(io::Error::from(io::ErrorKind::WouldBlock)));
                }
            }
            self.builder.take();
            let ipv6 =
                dest.is_ipv6() && self.socket.max_payload_to(&dest) > crate::wire::MAX_PAYLOAD_V4;
            self.builder
                .set_limits(Limits::new(self.socket.max_gso_segments(), ipv6, self.mtu));
            self.builder
                .offer(data.len())
                .map_err(|o| Error::PayloadTooLarge {
                    index: self.queued,
                    len: o.len,
                    max: o.max,
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
            });
        }
        self.buf.extend_from_slice(data);
        let t = self.trains.last_mut().expect("a train is open");
        t.end = self.buf.len();
        t.count += 1;
        self.queued += 1;
        Ok(())
    }

    /// Sends every queued train. Returns the number of datagrams sent.
    ///
    /// On a non-blocking socket the kernel may take only some: the rest stay
    /// queued, in order, for the next flush. An error means nothing was sent
    /// and everything is still queued.
    pub fn flush(&mut self) -> Result<usize, Error> {
        self.builder.take();
        if self.trains.is_empty() {
            return Ok(0);
        }
        let mut sent = 0;
        let mut first_err = None;
        let mut partial = 0;
        {
            let ts: Vec<Transmit<'_>> = self
                .trains
                .iter()
                .map(|q| Transmit {
                    destination: q.dest,
                    contents: &self.buf[q.start..q.end],
                    segment_size: (q.count > 1).then_some(q.segment_size),
                    ecn: q.ecn,
                    src_ip: q.src_ip,
                    txtime: None,
                })
                .collect();
            while sent < ts.len() {
                match self.socket.send(&ts[sent..]) {
                    Ok(0) => break,
                    Ok(n) => {
                        sent += n;
                        if sent < ts.len() {
                            break;
                        }
                    }
                    // Some datagrams of the front train went out one by one:
                    // drop exactly those from the queue.
                    Err(Error::PartialTrain {
                        index: 0, sent: k, ..
                    }) if k > 0 => {
                        partial = k;
                        break;
                    }
                    Err(e) => {
                        first_err = Some(e);
                        break;
                    }
                }
            }
        }
        let datagrams: usize = self.trains[..sent].iter().map(|t| t.count).sum();
        if sent == self.trains.len() {
            self.trains.clear();
            self.buf.clear();
        } else if sent > 0 {
            let cut = self.trains[sent].start;
            self.buf.drain(..cut);
            self.trains.drain(..sent);
            for t in &mut self.trains {
                t.start -= cut;
                t.end -= cut;
            }
        }
        if partial > 0 {
            let t = &mut self.trains[0];
            t.start += partial * t.segment_size;
            t.count -= partial;
        }
        self.queued -= datagrams + partial;
        match first_err {
            Some(e) if sent == 0 => Err(e),
            _ => Ok(datagrams + partial),
        }
    }
}
