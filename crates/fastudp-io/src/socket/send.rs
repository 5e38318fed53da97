//! The send path: validation, batching into `sendmmsg`, GSO trains, and
//! the fallbacks that never lose or repeat a datagram.

use super::state::{is_connected, is_v4_dest, UdpState};
use super::Transmit;
use crate::error::{ConfigError, Error};
use crate::sys::{self, SendMsg, MAX_BATCH};
use crate::wire::control::{encode_send, SendControl};
use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// What one send call got through: `transmits[..transmits]` whole, and
/// then the first `datagrams` datagrams of `transmits[transmits]` (only
/// ever non-zero for a train sent one datagram at a time, with GSO off).
/// Resume from there: [`Transmit::skip_datagrams`] gives the rest of a
/// split train.
///
/// Of those datagrams, `dropped_locally` never left the host: the kernel
/// answered `ENOBUFS` because a local queue (the device's qdisc) was full,
/// or it had no memory for the packet. They are done all the same, as
/// datagrams lost on the way would be: the caller must not send them again
/// as if they were waiting, and a protocol with loss recovery counts them
/// lost. The datagrams that did go out are the rest:
/// `sent + dropped_locally == offered`, where offered is the datagrams of
/// `transmits[..transmits]` plus `datagrams`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Sent {
    /// Transmits done whole (sent, or dropped by the local queue).
    pub transmits: usize,
    /// Datagrams of the next transmit done one by one before the call
    /// stopped.
    pub datagrams: usize,
    /// Of the datagrams above, those the local host dropped (`ENOBUFS`): a
    /// GSO train dropped at once counts all its datagrams.
    pub dropped_locally: usize,
}

impl Sent {
    /// True when all of `n` transmits are done (sent, or dropped locally).
    pub fn all(&self, n: usize) -> bool {
        self.transmits >= n
    }

    /// Datagrams done by this call: those of the first `transmits` of
    /// `offered` plus `datagrams`. [`Sent::dropped_locally`] of them were
    /// dropped by the local host, the rest went out.
    #[cfg(feature = "tokio")]
    pub(crate) fn datagrams_done(&self, offered: &[Transmit<'_>]) -> usize {
        offered[..self.transmits.min(offered.len())]
            .iter()
            .map(Transmit::segments)
            .sum::<usize>()
            + self.datagrams
    }
}

/// Transmits the send engine reads by index, so that a caller's slice and
/// the coalescer's queue are sent the same way without building a list.
pub(crate) trait Source<'a> {
    /// Number of transmits.
    fn count(&self) -> usize;
    /// Transmit `i` (`i < count()`).
    fn get(&self, i: usize) -> Transmit<'a>;
}

impl<'a> Source<'a> for &[Transmit<'a>] {
    fn count(&self) -> usize {
        self.len()
    }
    fn get(&self, i: usize) -> Transmit<'a> {
        self[i]
    }
}

/// One step of the engine. Datagrams dropped by the local queue are done,
/// and added to the step's drop count.
enum Step {
    /// This many transmits are done whole.
    Whole(usize),
    /// Of a split train, this many datagrams (at least 1, fewer than all).
    Partial(usize),
}

/// How often a send or receive is retried after errors that only reported
/// ICMP messages for earlier datagrams.
const ASYNC_RETRIES: usize = 4;

impl UdpState {
    /// Sends on `sock` (see [`crate::UdpIo::send`]).
    pub(crate) fn send_on(
        &self,
        sock: impl AsFd,
        transmits: &[Transmit<'_>],
    ) -> Result<Sent, Error> {
        self.send_from(sock.as_fd(), &transmits)
    }

    /// The engine behind `send` and the coalescer.
    pub(crate) fn send_from<'a>(
        &self,
        fd: BorrowedFd<'_>,
        src: &impl Source<'a>,
    ) -> Result<Sent, Error> {
        let n = src.count();
        for i in 0..n {
            self.validate(i, &src.get(i))?;
        }
        let mut done = 0;
        let mut dropped = 0;
        while done < n {
            match self.send_some(fd, src, done, &mut dropped) {
                Ok(Step::Whole(k)) => done += k,
                Ok(Step::Partial(d)) => {
                    return Ok(Sent {
                        transmits: done,
                        datagrams: d,
                        dropped_locally: dropped,
                    })
                }
                // transmits[..done] are done; the next call reports the error.
                Err(_) if done > 0 => break,
                Err(e) => return Err(e.at(done)),
            }
        }
        Ok(Sent {
            transmits: done,
            datagrams: 0,
            dropped_locally: dropped,
        })
    }

    /// Checks one transmit against everything the kernel would refuse.
    pub(crate) fn validate(&self, index: usize, t: &Transmit<'_>) -> Result<(), Error> {
        // An IPv4 socket takes IPv4 addresses only: the kernel answers
        // EAFNOSUPPORT to any sockaddr_in6 there, a v4-mapped one included.
        if !self.ipv6 && !t.destination.is_ipv4() {
            return Err(Error::from(crate::error::Detail::AddressFamily {
                index,
                destination: t.destination,
            }));
        }
        let max = self.max_payload_to(&t.destination);
        if t.contents.len() > max {
            return Err(Error::from(crate::error::Detail::PayloadTooLarge {
                index,
                len: t.contents.len(),
                max,
            }));
        }
        if t.segment_size == Some(0) {
            return Err(Error::from(crate::error::Detail::ZeroSegmentSize { index }));
        }
        let segs = t.segments();
        // Without GSO a train is split into datagrams, whatever its length.
        if segs > 1 && self.caps.max_gso_segments > 1 && segs > self.caps.kernel_max_segments {
            return Err(Error::from(crate::error::Detail::TooManySegments {
                index,
                segments: segs,
                max: self.caps.kernel_max_segments,
            }));
        }
        if t.txtime.is_some() && !self.txtime.load(Relaxed) {
            return Err(ConfigError::TxtimeOff { index }.into());
        }
        if let (Some(IpAddr::V6(v6)), false) = (t.src_ip, self.ipv6) {
            if v6.to_ipv4_mapped().is_none() {
                return Err(Error::from(crate::error::Detail::AddressFamily {
                    index,
                    destination: t.destination,
                }));
            }
        }
        Ok(())
    }

    /// The destination in the socket's family (v4-mapped on an IPv6 socket).
    fn dest_addr(&self, d: &SocketAddr) -> SocketAddr {
        match (self.ipv6, d) {
            (true, SocketAddr::V4(v4)) => {
                SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0))
            }
            _ => *d,
        }
    }

    /// Encodes a transmit's control data; `segment` is its GSO size when it
    /// goes as a train.
    fn encode(
        &self,
        t: &Transmit<'_>,
        segment: Option<u16>,
        buf: &mut [u8],
        allow_ecn: bool,
    ) -> Result<usize, Error> {
        let ctl = SendControl {
            segment_size: segment,
            ecn: t.ecn.filter(|_| allow_ecn && self.ecn.load(Relaxed)),
            src_ip: t
                .src_ip
                .filter(|_| !self.caps.is_disabled(crate::Feature::Pktinfo)),
            txtime: t.txtime,
        };
        encode_send(buf, &ctl, is_v4_dest(&t.destination), self.ipv6).map_err(|e| {
            Error::from(crate::error::Detail::Control(io::Error::new(
                io::ErrorKind::InvalidInput,
                e,
            )))
        })
    }

    /// One message of a send, its control data encoded into `ctl`.
    pub(crate) fn message<'a>(
        &self,
        t: &Transmit<'a>,
        payload: &'a [u8],
        gso: bool,
        ctl: &mut [u8],
        allow_ecn: bool,
    ) -> Result<SendMsg<'a>, Error> {
        let seg = (gso && t.segments() > 1).then(|| t.segment_size.unwrap_or(0) as u16);
        Ok(SendMsg {
            dest: Some(self.dest_addr(&t.destination)),
            payload,
            control_len: self.encode(t, seg, ctl, allow_ecn)?,
        })
    }

    /// One `sendmsg` of one validated transmit with extra `flags` (such as
    /// `MSG_ZEROCOPY`), as a GSO train if it has several segments, with no
    /// fallback: the caller handles errors.
    pub(crate) fn send_one_flags(
        &self,
        fd: BorrowedFd<'_>,
        t: &Transmit<'_>,
        flags: i32,
    ) -> io::Result<()> {
        let r = sys::send_batch(fd, 1, flags, false, |_, ctl| {
            self.message(t, t.contents, true, ctl, true)
        })
        .map_err(io::Error::from)?;
        self.c.send_calls.fetch_add(1, Relaxed);
        if r.is_ok() {
            self.c.send_messages.fetch_add(1, Relaxed);
        }
        r.map(drop)
    }

    /// One batch of at most `n` messages built by `fill` ([`sys::send_batch`]):
    /// on the io_uring ring when this socket has one, else with one
    /// `sendmmsg`/`sendmsg`. All fallbacks around it are the same.
    ///
    /// On the ring, bit `i` of `holes` is set when message `i` failed while
    /// a later one went out (see `sys::uring::SendRing::send_batch`): the
    /// count returned then reaches past it, and the caller resends it.
    fn send_batch<'a>(
        &self,
        fd: BorrowedFd<'_>,
        n: usize,
        holes: &mut u128,
        fill: impl FnMut(usize, &mut [u8]) -> Result<SendMsg<'a>, Error>,
    ) -> Result<io::Result<usize>, Error> {
        *holes = 0;
        #[cfg(feature = "uring")]
        let fill = {
            let mut fill = fill;
            if let Some(b) = self.backend_for(fd) {
                let n = if self.caps.supports(crate::Feature::Mmsg) {
                    n
                } else {
                    n.min(1)
                };
                match b.send_batch(self, fd, n, true, holes, &mut fill) {
                    // The ring sends never wait. A blocking socket whose
                    // buffer is full waits for room: on the ring, or with
                    // the syscall below when it has a send timeout, which
                    // io_uring does not honour.
                    Some(Ok(Err(e)))
                        if e.kind() == io::ErrorKind::WouldBlock
                            && !sys::is_nonblocking(fd).unwrap_or(true) =>
                    {
                        let timeout = socket2::SockRef::from(&fd).write_timeout();
                        if let Ok(None) = timeout {
                            if let Some(r) = b.send_batch(self, fd, n, false, holes, &mut fill) {
                                return r;
                            }
                        }
                    }
                    Some(r) => return r,
                    None => {}
                }
            }
            fill
        };
        sys::send_batch(fd, n, 0, self.caps.supports(crate::Feature::Mmsg), fill)
    }

    /// The socket's errors from ICMP messages for earlier datagrams come
    /// back from any later send or receive (`sk_err`). When `e` may be one,
    /// reads the error queue into fastudp's; returns true when the call
    /// should be retried: the socket is unconnected, so those errors are
    /// not about this call, and ICMP messages were indeed queued.
    pub(crate) fn absorb_async_error(&self, fd: BorrowedFd<'_>, e: &io::Error) -> bool {
        if !matches!(
            e.raw_os_error(),
            Some(
                libc::ECONNREFUSED
                    | libc::EHOSTUNREACH
                    | libc::ENETUNREACH
                    | libc::EHOSTDOWN
                    | libc::ENETDOWN
                    | libc::EMSGSIZE
                    | libc::EPROTO
                    | libc::EACCES
                    | libc::ETIMEDOUT
                    | libc::ENOPROTOOPT
                    | libc::ECONNRESET
            )
        ) {
            return false;
        }
        let icmp = self.drain_errors(fd);
        if icmp == 0 {
            return false;
        }
        self.c.async_errors.fetch_add(1, Relaxed);
        !is_connected(fd)
    }

    /// One syscall's worth of transmits from `src[from..]`, with fallbacks.
    /// Datagrams the local queue dropped are added to `dropped`.
    fn send_some<'a>(
        &self,
        fd: BorrowedFd<'_>,
        src: &impl Source<'a>,
        from: usize,
        dropped: &mut usize,
    ) -> Result<Step, Error> {
        // Set after a refusal, to retry once without ECN marks; the error
        // that caused it is recorded only if the retry then succeeds.
        let mut ecn_refused: Option<io::Error> = None;
        let mut retries = 0;
        let t = src.get(from);
        loop {
            let short_tails_off = self.short_tail_refused.load(Relaxed);
            let gso = self.goes_gso(&t, short_tails_off);
            if !gso && t.segments() > 1 {
                return self.send_split(fd, &t, dropped);
            }
            let n = self.batch_len(fd, src, from, short_tails_off);
            let allow_ecn = ecn_refused.is_none();
            #[cfg(test)]
            let injected = super::faults::refused(
                &t,
                t.ecn.is_some() && self.ecn.load(Relaxed) && allow_ecn,
                gso,
            );
            #[cfg(not(test))]
            let injected: Option<io::Error> = None;
            let mut holes = 0u128;
            let r = match injected {
                Some(e) => Err(e),
                None => self.send_batch(fd, n, &mut holes, |i, ctl| {
                    let ti = src.get(from + i);
                    // Only single datagrams and trains that go with GSO now
                    // were taken into the batch.
                    self.message(&ti, ti.contents, true, ctl, allow_ecn)
                })?,
            };
            self.c.send_calls.fetch_add(1, Relaxed);
            let e = match r {
                Ok(k) => {
                    self.count_sent(fd, src, from, k, holes);
                    if holes & 1 == 0 {
                        if let Some(cause) = ecn_refused {
                            self.disable_ecn(&cause, &t.destination);
                        }
                        if gso && t.segments() > 1 {
                            self.gso_worked(&t.destination);
                        }
                    }
                    self.resend_holes(fd, src, from, k, holes, dropped);
                    return Ok(Step::Whole(k));
                }
                Err(e) => e,
            };
            let refused = matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL));
            if refused && t.ecn.is_some() && self.ecn.load(Relaxed) && allow_ecn {
                ecn_refused = Some(e);
                continue;
            }
            if retries < ASYNC_RETRIES && self.absorb_async_error(fd, &e) {
                retries += 1;
                continue;
            }
            return self.batch_failed(fd, &t, e, short_tails_off, dropped);
        }
    }

    /// Whether transmit `t` goes as one GSO send now (`short_tails_off`:
    /// trains with a short last datagram were refused).
    #[inline]
    fn goes_gso(&self, t: &Transmit<'_>, short_tails_off: bool) -> bool {
        self.max_gso_segments_to(&t.destination) > 1 && !(short_tails_off && short_tail(t))
    }

    /// How many transmits from `src[from..]` go in the next batch: single
    /// datagrams and trains that go with GSO now, up to the batch limit.
    #[inline]
    fn batch_len<'a>(
        &self,
        fd: BorrowedFd<'_>,
        src: &impl Source<'a>,
        from: usize,
        short_tails_off: bool,
    ) -> usize {
        let limit = if self.caps.supports(crate::Feature::Mmsg) {
            MAX_BATCH
        } else {
            1
        };
        let n = (from..src.count())
            .take(limit)
            .take_while(|&i| {
                let x = src.get(i);
                x.segments() == 1 || self.goes_gso(&x, short_tails_off)
            })
            .count();
        // On the io_uring ring a batch is not stopped by a failure: a
        // transmit with datagrams larger than any sent so far (a
        // path-MTU probe) ends its batch, so that its EMSGSIZE is
        // reported for it alone, with nothing sent after it.
        #[cfg(feature = "uring")]
        let n = match self.backend_for(fd) {
            Some(b) => b.cut_after_growth(n, &|i| largest_datagram(&src.get(from + i))),
            None => n,
        };
        #[cfg(not(feature = "uring"))]
        let _ = fd;
        n
    }

    /// Counts the messages of a batch that went out: the first `k` from
    /// `src[from..]`, but for the `holes`.
    #[inline]
    fn count_sent<'a>(
        &self,
        fd: BorrowedFd<'_>,
        src: &impl Source<'a>,
        from: usize,
        k: usize,
        holes: u128,
    ) {
        let lost = holes.count_ones() as usize;
        self.c.send_messages.fetch_add((k - lost) as u64, Relaxed);
        #[cfg(feature = "uring")]
        if let Some(b) = self.backend_for(fd) {
            b.note_sent_size(
                (0..k)
                    .filter(|&i| holes & (1u128 << i) == 0)
                    .map(|i| largest_datagram(&src.get(from + i)))
                    .max()
                    .unwrap_or(0),
            );
        }
        #[cfg(not(feature = "uring"))]
        let _ = (fd, src, from);
    }

    /// Resends each hole of a batch (`holes`, among its first `k` messages
    /// from `src[from..]`) through the whole send path.
    #[inline]
    fn resend_holes<'a>(
        &self,
        fd: BorrowedFd<'_>,
        src: &impl Source<'a>,
        from: usize,
        k: usize,
        holes: u128,
        dropped: &mut usize,
    ) {
        for i in (0..k).filter(|&i| holes & (1u128 << i) != 0) {
            let ti = src.get(from + i);
            let one = [ti];
            let r = self.send_from(fd, &&one[..]);
            self.hole_done(&ti, r, dropped);
        }
    }

    /// What a batch whose first message `t` failed with `e` comes to, once
    /// the ECN and ICMP retries are spent: a drop by the local queue, a GSO
    /// refusal resent one datagram at a time, or the error.
    fn batch_failed(
        &self,
        fd: BorrowedFd<'_>,
        t: &Transmit<'_>,
        e: io::Error,
        short_tails_off: bool,
        dropped: &mut usize,
    ) -> Result<Step, Error> {
        let errno = e.raw_os_error();
        let refused = matches!(errno, Some(libc::EIO) | Some(libc::EINVAL));
        if errno == Some(libc::ENOBUFS) {
            // The first message of the batch was dropped by the local
            // queue (the messages before it, none here, would have been
            // counted as sent): it is done, as it would be without
            // IP_RECVERR. The next step goes on with the one after it.
            self.dropped_locally(t.segments(), dropped);
            return Ok(Step::Whole(1));
        }
        if refused && t.segments() > 1 {
            // Is GSO to blame? The same datagrams, one by one: only if
            // that works is GSO turned off.
            let step = self.send_split(fd, t, dropped)?;
            let k = match step {
                Step::Whole(_) => t.segments(),
                Step::Partial(k) => k,
            };
            self.c.resent.fetch_add(k as u64, Relaxed);
            if short_tail(t) && !short_tails_off {
                self.disable_short_tail(&e, &t.destination);
            } else {
                self.disable_gso(&e, &t.destination);
            }
            return Ok(step);
        }
        if errno == Some(libc::EMSGSIZE) {
            return Err(if t.segments() > 1 {
                Error::from(crate::error::Detail::SegmentExceedsMtu {
                    index: 0,
                    segment_size: t.segment_size.unwrap_or(0),
                    destination: t.destination,
                })
            } else {
                Error::from(crate::error::Detail::DatagramExceedsMtu {
                    index: 0,
                    len: t.contents.len(),
                    destination: t.destination,
                })
            });
        }
        Err(Error::from(e))
    }

    /// Sends every datagram of a train as its own message. Once the first
    /// one is out, on a blocking socket the rest go out too: the call waits
    /// for buffer space (up to [`crate::Config::split_wait`]) rather than
    /// leave a train half sent. A non-blocking socket never waits: the
    /// count sent so far is returned, and the caller resumes. A datagram
    /// the local queue drops (`ENOBUFS`) is done: it is added to `dropped`,
    /// and the rest go on.
    fn send_split(
        &self,
        fd: BorrowedFd<'_>,
        t: &Transmit<'_>,
        dropped: &mut usize,
    ) -> Result<Step, Error> {
        let seg = t.segment_size.unwrap_or(t.contents.len()).max(1);
        let total = t.segments();
        let chunk = |i: usize| {
            let at = (i * seg).min(t.contents.len());
            &t.contents[at..(at + seg).min(t.contents.len())]
        };
        let mut sent = 0;
        // Set at the first stop: `Some(None)` when the wait is too long for
        // an `Instant` (no deadline at all).
        let mut deadline: Option<Option<Instant>> = None;
        let mut ecn_refused: Option<io::Error> = None;
        let mut retries = 0;
        while sent < total {
            let n = (total - sent).min(if self.caps.supports(crate::Feature::Mmsg) {
                MAX_BATCH
            } else {
                1
            });
            let allow_ecn = ecn_refused.is_none();
            let mut holes = 0u128;
            let r = self.send_batch(fd, n, &mut holes, |i, ctl| {
                self.message(t, chunk(sent + i), false, ctl, allow_ecn)
            })?;
            self.c.send_calls.fetch_add(1, Relaxed);
            let e = match r {
                Ok(k) => {
                    let lost = holes.count_ones() as usize;
                    self.c.send_messages.fetch_add((k - lost) as u64, Relaxed);
                    for i in (0..k).filter(|&i| holes & (1u128 << i) != 0) {
                        // The datagram alone, through the whole send path.
                        let one = [Transmit {
                            contents: chunk(sent + i),
                            segment_size: None,
                            ..*t
                        }];
                        let r = self.send_from(fd, &&one[..]);
                        self.hole_done(&one[0], r, dropped);
                    }
                    sent += k;
                    if let Some(cause) = ecn_refused.take() {
                        self.disable_ecn(&cause, &t.destination);
                    }
                    continue;
                }
                Err(e) => e,
            };
            let errno = e.raw_os_error();
            if matches!(errno, Some(libc::EIO) | Some(libc::EINVAL))
                && t.ecn.is_some()
                && self.ecn.load(Relaxed)
                && allow_ecn
            {
                ecn_refused = Some(e);
                continue;
            }
            if retries < ASYNC_RETRIES && self.absorb_async_error(fd, &e) {
                retries += 1;
                continue;
            }
            if errno == Some(libc::ENOBUFS) {
                // Datagram `sent` was dropped by the local queue: done.
                self.dropped_locally(1, dropped);
                sent += 1;
                continue;
            }
            if sent == 0 {
                return Err(Error::from(e));
            }
            let would_block = e.kind() == io::ErrorKind::WouldBlock;
            let blocking = !sys::is_nonblocking(fd).unwrap_or(true);
            let dl = *deadline.get_or_insert_with(|| Instant::now().checked_add(self.split_wait));
            if !would_block || !blocking || dl.is_some_and(|dl| Instant::now() >= dl) {
                return Ok(Step::Partial(sent));
            }
            // A blocking socket with a send timeout (SO_SNDTIMEO).
            let _ = sys::poll(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                sys::POLLOUT,
                Duration::from_millis(100),
            );
        }
        Ok(Step::Whole(1))
    }
}

/// The payload of a transmit's largest datagram.
#[cfg(feature = "uring")]
fn largest_datagram(t: &Transmit<'_>) -> usize {
    t.segment_size
        .map_or(t.contents.len(), |s| s.min(t.contents.len()))
}

impl UdpState {
    /// Accounts for the resend of a hole (a send of an unlinked io_uring
    /// batch that failed while a later one went out): `r` is what the
    /// resend of transmit `t` did. Its datagrams that still did not go are
    /// counted as dropped locally, with the reason recorded: the transmits
    /// after it went out, so it can be neither reported unsent nor sent
    /// again later.
    fn hole_done(&self, t: &Transmit<'_>, r: Result<Sent, Error>, dropped: &mut usize) {
        let segs = t.segments();
        let (left, why) = match r {
            Ok(s) => {
                *dropped += s.dropped_locally;
                if s.transmits >= 1 {
                    (0, None)
                } else {
                    (segs.saturating_sub(s.datagrams), None)
                }
            }
            Err(e) => (segs, Some(e)),
        };
        #[cfg(feature = "uring")]
        if let Some(b) = self.backend.as_deref() {
            b.note_hole(left == 0);
        }
        if left > 0 {
            self.dropped_locally(left, dropped);
            #[cfg(feature = "uring")]
            self.record(
                crate::Feature::Uring,
                why.as_ref().and_then(|e| match e.detail() {
                    crate::error::Detail::Io(e) => e.raw_os_error(),
                    _ => None,
                }),
                format!(
                    "a send of an unlinked io_uring batch failed after later ones went out, and its resend failed too ({}): {left} datagrams to {} counted as dropped locally",
                    why.as_ref().map_or_else(|| "the socket buffer is full".to_string(), |e| e.to_string()),
                    t.destination
                ),
            );
        }
        let _ = why;
    }

    /// Counts `n` datagrams dropped by the local queue, in the stats and in
    /// the call's `dropped`.
    pub(crate) fn dropped_locally(&self, n: usize, dropped: &mut usize) {
        self.c.dropped_locally.fetch_add(n as u64, Relaxed);
        *dropped += n;
    }
}

/// True for a GSO train whose last datagram is shorter than the others.
fn short_tail(t: &Transmit<'_>) -> bool {
    let seg = t.segment_size.unwrap_or(0);
    t.segments() > 1 && seg > 0 && t.contents.len() % seg != 0
}
