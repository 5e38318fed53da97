//! The batched UDP socket.

use crate::caps::{self, Capabilities, Disabled};
use crate::error::{Error, FallbackEvent, Feature};
use crate::sys::{self, InMeta, OutMsg, MAX_BATCH};
use crate::wire::cmsg::CmsgBuf;
use crate::wire::consts::*;
use crate::wire::control::{decode_recv, encode_send, EcnCodepoint, SendControl};
use crate::wire::gro::Datagrams;
use crate::wire::{max_payload, plan};
use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One send: a payload to a destination, optionally a GSO train.
#[derive(Debug, Clone, Copy)]
pub struct Transmit<'a> {
    /// Where the datagrams go.
    pub destination: SocketAddr,
    /// The payload. With a `segment_size`, several datagrams laid end to end.
    pub contents: &'a [u8],
    /// Bytes per datagram of a train; the last may be shorter. `None` (or a
    /// size not smaller than `contents`) sends one datagram.
    pub segment_size: Option<usize>,
    /// ECN codepoint for every datagram of this transmit.
    pub ecn: Option<EcnCodepoint>,
    /// Source address to send from (`IP_PKTINFO` / `IPV6_PKTINFO`).
    pub src_ip: Option<IpAddr>,
    /// Earliest departure time, in ns of `CLOCK_MONOTONIC` (`SCM_TXTIME`;
    /// see [`Socket::enable_txtime`]). Every segment of a train shares it.
    pub txtime: Option<u64>,
}

impl<'a> Transmit<'a> {
    /// One datagram to `destination`.
    pub fn new(destination: SocketAddr, contents: &'a [u8]) -> Self {
        Transmit {
            destination,
            contents,
            segment_size: None,
            ecn: None,
            src_ip: None,
            txtime: None,
        }
    }

    /// A GSO train of `segment_size`-byte datagrams.
    pub fn train(destination: SocketAddr, contents: &'a [u8], segment_size: usize) -> Self {
        Transmit {
            segment_size: Some(segment_size),
            ..Transmit::new(destination, contents)
        }
    }

    /// How many datagrams this transmit carries.
    pub fn segments(&self) -> usize {
        plan::segments(self.contents.len(), self.segment_size)
    }
}

/// Options applied when a [`Socket`] is set up.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Turn UDP GRO on for receive (default true).
    pub gro: bool,
    /// Features to switch off in code, on top of [`caps::DISABLE_ENV`].
    pub disabled: Disabled,
    /// `SO_RCVBUF` to request, in bytes.
    pub recv_buffer: Option<usize>,
    /// `SO_SNDBUF` to request, in bytes.
    pub send_buffer: Option<usize>,
    /// How long a train sent one datagram at a time (GSO off) may wait for
    /// send-buffer space once its first datagram is out, before the send
    /// stops with [`Error::PartialTrain`] (default 5 s).
    pub split_wait: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            gro: true,
            disabled: Disabled::default(),
            recv_buffer: None,
            send_buffer: None,
            split_wait: SPLIT_DEADLINE,
        }
    }
}

/// Counters and fallback events of one socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// `sendmmsg`/`sendmsg` calls made.
    pub send_calls: u64,
    /// Messages the kernel accepted (a GSO train counts once).
    pub send_messages: u64,
    /// `recvmmsg`/`recvmsg` calls that returned data.
    pub recv_calls: u64,
    /// Messages received (a GRO train counts once).
    pub recv_messages: u64,
    /// Datagrams resent one by one after a GSO send failed.
    pub resent_unsegmented: u64,
    /// Messages received with `MSG_TRUNC`: the buffer was too small and the
    /// tail of the message was lost.
    pub truncated: u64,
    /// Messages received with `MSG_CTRUNC`: some control data was lost.
    pub control_truncated: u64,
    /// The kernel's drop counter for this socket, in messages (a GRO train
    /// counts once): `SO_MEMINFO` now, or `SO_RXQ_OVFL` as last reported.
    pub kernel_drops: u64,
    /// Every feature the socket turned off at run time, and why.
    pub fallbacks: Vec<FallbackEvent>,
}

/// A UDP socket that sends and receives batches of datagrams with
/// sendmmsg/recvmmsg, GSO and GRO, and falls back at run time without
/// losing a datagram.
///
/// All methods take `&self`; one socket can be shared by threads.
#[derive(Debug)]
pub struct Socket {
    inner: UdpSocket,
    ipv6: bool,
    caps: Capabilities,
    split_wait: Duration,
    gso_segments: AtomicUsize,
    ecn: AtomicBool,
    txtime: AtomicBool,
    send_calls: AtomicU64,
    send_messages: AtomicU64,
    recv_calls: AtomicU64,
    recv_messages: AtomicU64,
    resent: AtomicU64,
    truncated: AtomicU64,
    ctruncated: AtomicU64,
    drops: AtomicU64,
    fallbacks: Mutex<Vec<FallbackEvent>>,
}

/// How long a train that GSO could not send may wait for buffer space while
/// its datagrams go out one by one, unless [`Config::split_wait`] says.
pub const SPLIT_DEADLINE: Duration = Duration::from_secs(5);

/// A new, unbound UDP socket of `addr`'s family; IPv6 ones are dual-stack
/// where the system allows it.
pub(crate) fn new_udp(addr: SocketAddr) -> Result<socket2::Socket, Error> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))
        .map_err(|e| Error::Setup {
            what: "socket",
            source: e,
        })?;
    if addr.is_ipv6() {
        // Best effort: some systems forbid dual-stack sockets.
        let _ = s.set_only_v6(false);
    }
    Ok(s)
}

impl Socket {
    /// Binds a new socket. An IPv6 wildcard address gives a dual-stack
    /// socket that also serves IPv4 peers (as v4-mapped addresses).
    pub fn bind(addr: SocketAddr) -> Result<Self, Error> {
        Self::bind_with(addr, Config::default())
    }

    /// Binds a new socket with options.
    pub fn bind_with(addr: SocketAddr, config: Config) -> Result<Self, Error> {
        let s = new_udp(addr)?;
        s.bind(&addr.into())
            .map_err(|e| Error::Bind { addr, source: e })?;
        Self::from_std_with(s.into(), config)
    }

    /// Wraps an existing socket with default options.
    pub fn from_std(sock: UdpSocket) -> Result<Self, Error> {
        Self::from_std_with(sock, Config::default())
    }

    /// Wraps an existing socket, probes what it supports and sets it up.
    pub fn from_std_with(sock: UdpSocket, config: Config) -> Result<Self, Error> {
        let disabled = Disabled::from_env()
            .map_err(Error::Config)?
            .union(config.disabled);
        let ipv6 = sock
            .local_addr()
            .map_err(|e| Error::Setup {
                what: "getsockname",
                source: e,
            })?
            .is_ipv6();
        let fd = sock.as_raw_fd();
        let sref = socket2::SockRef::from(&sock);
        // SO_RCVBUF/SO_SNDBUF are capped at net.core.rmem_max/wmem_max; with
        // CAP_NET_ADMIN the FORCE variants go past the cap.
        if let Some(n) = config.recv_buffer {
            sref.set_recv_buffer_size(n).map_err(|e| Error::Setup {
                what: "SO_RCVBUF",
                source: e,
            })?;
            force_buffer(fd, sref.recv_buffer_size(), n, sys::SO_RCVBUFFORCE);
        }
        if let Some(n) = config.send_buffer {
            sref.set_send_buffer_size(n).map_err(|e| Error::Setup {
                what: "SO_SNDBUF",
                source: e,
            })?;
            force_buffer(fd, sref.send_buffer_size(), n, sys::SO_SNDBUFFORCE);
        }
        let linux = cfg!(any(target_os = "linux", target_os = "android"));
        let on = |level, name| sys::setsockopt_int(fd, level, name, 1).is_ok();

        // GSO: the option must be accepted; reset it to 0 so that sends
        // without a cmsg are never segmented.
        let kernel_max = caps::kernel_max_segments();
        let gso_ok = sys::setsockopt_int(fd, SOL_UDP, UDP_SEGMENT, 1472).is_ok();
        if gso_ok {
            sys::setsockopt_int(fd, SOL_UDP, UDP_SEGMENT, 0).map_err(|e| Error::Setup {
                what: "UDP_SEGMENT reset",
                source: e,
            })?;
        }
        let max_gso_segments = if gso_ok && !disabled.gso && kernel_max > 1 {
            kernel_max
        } else {
            1
        };
        let gro = config.gro && !disabled.gro && on(SOL_UDP, UDP_GRO);
        let ecn = !disabled.ecn && {
            if ipv6 {
                let v6 = on(SOL_IPV6, IPV6_RECVTCLASS);
                let _ = on(SOL_IP, IP_RECVTOS); // v4-mapped peers
                v6
            } else {
                on(SOL_IP, IP_RECVTOS)
            }
        };
        let pktinfo = !disabled.pktinfo && {
            if ipv6 {
                let v6 = on(SOL_IPV6, IPV6_RECVPKTINFO);
                let _ = on(SOL_IP, IP_PKTINFO);
                v6
            } else {
                on(SOL_IP, IP_PKTINFO)
            }
        };
        let rxq_ovfl = on(SOL_SOCKET, SO_RXQ_OVFL);
        let (zc, txtime) = caps::zerocopy_and_txtime();
        let caps = Capabilities {
            max_gso_segments,
            kernel_max_segments: kernel_max.max(1),
            gro,
            ecn,
            pktinfo,
            mmsg: linux && !disabled.mmsg,
            rxq_ovfl,
            zerocopy: zc && !disabled.zerocopy,
            txtime: txtime && !disabled.txtime,
            disabled,
        };
        Ok(Socket {
            inner: sock,
            ipv6,
            caps,
            split_wait: config.split_wait,
            gso_segments: AtomicUsize::new(max_gso_segments),
            ecn: AtomicBool::new(ecn),
            txtime: AtomicBool::new(false),
            send_calls: AtomicU64::new(0),
            send_messages: AtomicU64::new(0),
            recv_calls: AtomicU64::new(0),
            recv_messages: AtomicU64::new(0),
            resent: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            ctruncated: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            fallbacks: Mutex::new(Vec::new()),
        })
    }

    /// What was probed when the socket was set up.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// GSO segments per send now: the probed maximum, or 1 once GSO was
    /// turned off for this socket after a failed send.
    pub fn max_gso_segments(&self) -> usize {
        self.gso_segments.load(Relaxed)
    }

    /// Whether ECN marks are still sent (false after an ECN fallback).
    pub fn ecn_enabled(&self) -> bool {
        self.ecn.load(Relaxed)
    }

    /// True for an `AF_INET6` socket.
    pub fn is_ipv6(&self) -> bool {
        self.ipv6
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The wrapped standard socket, e.g. to set timeouts or non-blocking mode.
    pub fn as_std(&self) -> &UdpSocket {
        &self.inner
    }

    /// The kernel's count of messages this socket dropped (`sk_drops`;
    /// a dropped GRO train counts once, however many datagrams it held),
    /// read now with `SO_MEMINFO`, or as last reported by `SO_RXQ_OVFL` on a
    /// received message where `SO_MEMINFO` is not available. A drop after
    /// the last received message shows up here, not in any message.
    pub fn kernel_drops(&self) -> u64 {
        let now = sys::socket_drops(self.inner.as_raw_fd())
            .map(u64::from)
            .unwrap_or(0);
        now.max(self.drops.load(Relaxed))
    }

    /// Turns on `SO_TXTIME` (clock `CLOCK_MONOTONIC`), so that a
    /// [`Transmit::txtime`] reaches the kernel as `SCM_TXTIME`. With
    /// `report_errors`, packets the qdisc drops for a missed or invalid time
    /// are reported on the error queue ([`Socket::take_errors`]).
    ///
    /// The kernel accepts this on any path, but only an EDT-aware egress
    /// qdisc (fq, etf) holds a packet until its time; elsewhere it leaves at
    /// once. See [`crate::pacing::choose_mode`].
    pub fn enable_txtime(&self, report_errors: bool) -> Result<(), Error> {
        if self.caps.disabled.txtime {
            return Err(Error::Config(
                "SO_TXTIME is switched off (FASTUDP_DISABLE)".into(),
            ));
        }
        let flags = if report_errors { 2 } else { 0 }; // SOF_TXTIME_REPORT_ERRORS
        sys::set_txtime(self.inner.as_raw_fd(), libc::CLOCK_MONOTONIC, flags).map_err(|e| {
            Error::Setup {
                what: "SO_TXTIME",
                source: e,
            }
        })?;
        self.txtime.store(true, Relaxed);
        Ok(())
    }

    /// Caps this *connected* socket's rate at `bytes_per_sec`
    /// (`SO_MAX_PACING_RATE`), for the kernel to pace: honoured by the fq
    /// qdisc (and by TCP's internal pacing), ignored by other qdiscs. The
    /// socket must be connected: the rate belongs to one peer.
    pub fn set_max_pacing_rate(&self, bytes_per_sec: u64) -> Result<(), Error> {
        if self.inner.peer_addr().is_err() {
            return Err(Error::Config(
                "SO_MAX_PACING_RATE paces one peer: connect the socket first (Socket::as_std().connect)".into(),
            ));
        }
        if bytes_per_sec == 0 {
            return Err(Error::Config(
                "a pacing rate of 0 bytes per second would stop the socket".into(),
            ));
        }
        sys::setsockopt_bytes(
            self.inner.as_raw_fd(),
            SOL_SOCKET,
            sys::SO_MAX_PACING_RATE,
            &bytes_per_sec.to_ne_bytes(),
        )
        .map_err(|e| Error::Setup {
            what: "SO_MAX_PACING_RATE",
            source: e,
        })
    }

    /// The socket's `SO_MAX_PACING_RATE` in bytes per second (`u64::MAX`
    /// or `u32::MAX` when unlimited).
    pub fn max_pacing_rate(&self) -> Result<u64, Error> {
        sys::getsockopt_u64(self.inner.as_raw_fd(), SOL_SOCKET, sys::SO_MAX_PACING_RATE).map_err(
            |e| Error::Setup {
                what: "SO_MAX_PACING_RATE",
                source: e,
            },
        )
    }

    /// Reads everything queued on the socket's error queue now (zerocopy
    /// completions, txtime errors, ICMP errors with `IP_RECVERR`), without
    /// waiting. Do not call it on a socket that a [`crate::ZeroCopySender`]
    /// uses: it would take the completions that sender waits for, and its
    /// buffers would stay in flight.
    pub fn take_errors(&self) -> Result<Vec<crate::wire::zerocopy::ErrQueueMsg>, Error> {
        let mut out = Vec::new();
        let mut cb = CmsgBuf::default();
        while let Some(len) = sys::recv_errqueue(&self.inner, &mut cb).map_err(Error::Io)? {
            out.extend(
                crate::wire::zerocopy::parse_errqueue(&cb.0[..len.min(cb.0.len())])
                    .map_err(Error::Control)?,
            );
        }
        Ok(out)
    }

    /// Sets an `int` socket option (`setsockopt(2)`): an escape hatch for
    /// options fastudp does not wrap.
    pub fn set_option_int(&self, level: i32, name: i32, value: i32) -> io::Result<()> {
        sys::setsockopt_int(self.inner.as_raw_fd(), level, name, value)
    }

    /// Counters and fallback events so far.
    pub fn stats(&self) -> Stats {
        Stats {
            send_calls: self.send_calls.load(Relaxed),
            send_messages: self.send_messages.load(Relaxed),
            recv_calls: self.recv_calls.load(Relaxed),
            recv_messages: self.recv_messages.load(Relaxed),
            resent_unsegmented: self.resent.load(Relaxed),
            truncated: self.truncated.load(Relaxed),
            control_truncated: self.ctruncated.load(Relaxed),
            kernel_drops: self.kernel_drops(),
            fallbacks: self.fallbacks.lock().map(|v| v.clone()).unwrap_or_default(),
        }
    }

    /// The largest payload of one send to `dest` (65507 for IPv4
    /// destinations, including v4-mapped ones; 65527 for IPv6).
    pub fn max_payload_to(&self, dest: &SocketAddr) -> usize {
        max_payload(!is_v4_dest(dest))
    }

    pub(crate) fn validate(&self, index: usize, t: &Transmit<'_>) -> Result<(), Error> {
        if !self.ipv6 && !is_v4_dest(&t.destination) {
            return Err(Error::AddressFamily {
                index,
                destination: t.destination,
            });
        }
        let max = self.max_payload_to(&t.destination);
        if t.contents.len() > max {
            return Err(Error::PayloadTooLarge {
                index,
                len: t.contents.len(),
                max,
            });
        }
        if t.segment_size == Some(0) {
            return Err(Error::ZeroSegmentSize { index });
        }
        let segs = t.segments();
        // Without GSO a train is split into datagrams, whatever its length.
        if segs > 1
            && self.gso_segments.load(Relaxed) > 1
            && segs > self.caps.kernel_max_segments.max(1)
        {
            return Err(Error::TooManySegments {
                index,
                segments: segs,
                max: self.caps.kernel_max_segments,
            });
        }
        if t.txtime.is_some() && !self.txtime.load(Relaxed) {
            return Err(Error::Config(format!(
                "transmit {index} has a departure time, but SO_TXTIME is off: call Socket::enable_txtime first"
            )));
        }
        if let (Some(IpAddr::V6(v6)), false) = (t.src_ip, self.ipv6) {
            if v6.to_ipv4_mapped().is_none() {
                return Err(Error::AddressFamily {
                    index,
                    destination: t.destination,
                });
            }
        }
        Ok(())
    }

    pub(crate) fn dest_addr(&self, d: &SocketAddr) -> socket2::SockAddr {
        match (self.ipv6, d) {
            (true, SocketAddr::V4(v4)) => {
                SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0)).into()
            }
            _ => (*d).into(),
        }
    }

    pub(crate) fn control_with(
        &self,
        t: &Transmit<'_>,
        segment: Option<u16>,
        buf: &mut CmsgBuf,
        allow_ecn: bool,
    ) -> Result<usize, Error> {
        let ctl = SendControl {
            segment_size: segment,
            ecn: t.ecn.filter(|_| allow_ecn && self.ecn.load(Relaxed)),
            src_ip: t.src_ip.filter(|_| !self.caps.disabled.pktinfo),
            txtime: t.txtime,
        };
        encode_send(&mut buf.0, &ctl, is_v4_dest(&t.destination), self.ipv6).map_err(Error::Control)
    }

    fn record(&self, feature: Feature, errno: Option<i32>, reason: String) {
        if let Ok(mut v) = self.fallbacks.lock() {
            v.push(FallbackEvent {
                feature,
                errno,
                reason,
            });
        }
    }

    fn disable_gso(&self, e: &io::Error, dest: &SocketAddr) {
        if self.gso_segments.swap(1, Relaxed) > 1 {
            self.record(
                Feature::Gso,
                e.raw_os_error(),
                format!("GSO send to {dest} failed ({e}); GSO is off for this socket and datagrams go one by one"),
            );
        }
    }

    fn disable_ecn(&self, e: &io::Error, dest: &SocketAddr) {
        if self.ecn.swap(false, Relaxed) {
            self.record(
                Feature::Ecn,
                e.raw_os_error(),
                format!("send with an ECN mark to {dest} failed ({e}); ECN marks are off for this socket"),
            );
        }
    }

    /// Sends the transmits in order, as few syscalls as the features allow.
    ///
    /// Returns how many transmits were sent: `transmits[..n]` went out, the
    /// rest did not. `n` is smaller than `transmits.len()` when the kernel
    /// stopped early (`EAGAIN`/`EWOULDBLOCK` on a non-blocking socket,
    /// `ENOBUFS`, or an error on transmit `n`, which the next call reports).
    /// An error means nothing was sent.
    ///
    /// Every transmit is checked before any is sent: an oversized payload,
    /// a zero segment size or a train over the kernel's segment limit is an
    /// error that names the transmit. A GSO send the path refuses (`EIO` or
    /// `EINVAL`) turns GSO off for this socket and the same datagrams are
    /// sent one by one at once; an ECN mark that is refused is dropped and the
    /// send retried. Both are reported in [`Socket::stats`].
    pub fn send(&self, transmits: &[Transmit<'_>]) -> Result<usize, Error> {
        for (i, t) in transmits.iter().enumerate() {
            self.validate(i, t)?;
        }
        let mut done = 0;
        while done < transmits.len() {
            // A train sent one datagram at a time can end half sent; it is
            // only ever sent first in a call, so that such an outcome
            // (`Error::PartialTrain`) reaches the caller with its count.
            if done > 0 && self.gso_segments.load(Relaxed) <= 1 && transmits[done].segments() > 1 {
                break;
            }
            match self.send_some(&transmits[done..], done == 0) {
                Ok(n) => done += n,
                // transmits[..done] went out; the next call reports the error.
                Err(_) if done > 0 => break,
                Err(e) => return Err(e.at(done)),
            }
        }
        Ok(done)
    }

    /// One `sendmsg` of one transmit with extra `flags` (such as
    /// `MSG_ZEROCOPY`), with no fallback: the caller handles errors. The
    /// transmit must have been validated.
    pub(crate) fn send_one_flags(&self, t: &Transmit<'_>, flags: i32) -> Result<usize, io::Error> {
        let seg = (t.segments() > 1).then(|| t.segment_size.unwrap_or(0) as u16);
        let mut cb = CmsgBuf::default();
        let n = self
            .control_with(t, seg, &mut cb, true)
            .map_err(io::Error::from)?;
        let addr = self.dest_addr(&t.destination);
        let iov = [IoSlice::new(t.contents)];
        let m = OutMsg {
            addr: Some(&addr),
            iov: &iov,
            control: &cb.0[..n],
        };
        self.send_calls.fetch_add(1, Relaxed);
        let r = sys::sendmsg(&self.inner, &m, flags);
        if r.is_ok() {
            self.send_messages.fetch_add(1, Relaxed);
        }
        r
    }

    /// One syscall's worth of transmits, with fallbacks. Returns >= 1 or an
    /// error for `ts[0]`.
    fn send_some(&self, ts: &[Transmit<'_>], first_in_call: bool) -> Result<usize, Error> {
        // Set after a refusal, to retry once without ECN marks; the error
        // that caused it is recorded only if the retry then succeeds.
        let mut ecn_refused: Option<io::Error> = None;
        loop {
            let gso = self.gso_segments.load(Relaxed) > 1;
            if !gso && ts[0].segments() > 1 {
                return self.send_split(&ts[0]).map(|()| 1);
            }
            let limit = if self.caps.mmsg { MAX_BATCH } else { 1 };
            let n = ts
                .iter()
                .take(limit)
                .take_while(|t| gso || t.segments() == 1)
                .count();
            let batch = &ts[..n];
            let mut ctl = vec![CmsgBuf::default(); n];
            let mut ctl_len = Vec::with_capacity(n);
            let addrs: Vec<socket2::SockAddr> = batch
                .iter()
                .map(|t| self.dest_addr(&t.destination))
                .collect();
            let iovs: Vec<[IoSlice<'_>; 1]> =
                batch.iter().map(|t| [IoSlice::new(t.contents)]).collect();
            for (t, c) in batch.iter().zip(ctl.iter_mut()) {
                let seg = (t.segments() > 1).then(|| t.segment_size.unwrap_or(0) as u16);
                ctl_len.push(self.control_with(t, seg, c, ecn_refused.is_none())?);
            }
            let msgs: Vec<OutMsg<'_>> = (0..n)
                .map(|i| OutMsg {
                    addr: Some(&addrs[i]),
                    iov: &iovs[i],
                    control: &ctl[i].0[..ctl_len[i]],
                })
                .collect();
            #[cfg(test)]
            let injected = faults::refused(
                batch[0].ecn.is_some() && self.ecn.load(Relaxed) && ecn_refused.is_none(),
            );
            #[cfg(not(test))]
            let injected: Option<io::Error> = None;
            let r = if let Some(e) = injected {
                Err(e)
            } else if self.caps.mmsg {
                sys::sendmmsg(&self.inner, &msgs, 0)
            } else {
                sys::sendmsg(&self.inner, &msgs[0], 0).map(|_| 1)
            };
            self.send_calls.fetch_add(1, Relaxed);
            let e = match r {
                Ok(k) => {
                    self.send_messages.fetch_add(k as u64, Relaxed);
                    if let Some(cause) = ecn_refused {
                        self.disable_ecn(&cause, &ts[0].destination);
                    }
                    return Ok(k);
                }
                Err(e) => e,
            };
            let t = &ts[0];
            let errno = e.raw_os_error();
            let refused = matches!(errno, Some(libc::EIO) | Some(libc::EINVAL));
            if refused && t.ecn.is_some() && self.ecn.load(Relaxed) && ecn_refused.is_none() {
                ecn_refused = Some(e);
                continue;
            }
            if refused && t.segments() > 1 {
                if !first_in_call {
                    // Retried first in the next call, where a partial
                    // outcome can be reported exactly.
                    return Err(Error::Io(e));
                }
                // Is GSO to blame? The same datagrams, one by one: only if
                // that works is GSO turned off for this socket.
                self.send_split(t)?;
                self.resent.fetch_add(t.segments() as u64, Relaxed);
                self.disable_gso(&e, &t.destination);
                return Ok(1);
            }
            if errno == Some(libc::EMSGSIZE) && t.segments() > 1 {
                return Err(Error::SegmentExceedsMtu {
                    index: 0,
                    segment_size: t.segment_size.unwrap_or(0),
                    destination: t.destination,
                });
            }
            return Err(Error::Io(e));
        }
    }

    /// Sends every datagram of a train as its own message. Once the first
    /// one is out, the rest go out too: the call waits for buffer space (up
    /// to [`Config::split_wait`]) rather than leave a train half sent; if it
    /// still cannot finish, [`Error::PartialTrain`] says how many went.
    fn send_split(&self, t: &Transmit<'_>) -> Result<(), Error> {
        let seg = t.segment_size.unwrap_or(t.contents.len()).max(1);
        let chunks: Vec<&[u8]> = t.contents.chunks(seg).collect();
        let total = chunks.len();
        let addr = self.dest_addr(&t.destination);
        let mut sent = 0;
        let mut deadline: Option<Instant> = None;
        let mut ecn_refused: Option<io::Error> = None;
        while sent < total {
            let n = (total - sent).min(if self.caps.mmsg { MAX_BATCH } else { 1 });
            let mut cb = CmsgBuf::default();
            let clen = self.control_with(t, None, &mut cb, ecn_refused.is_none())?;
            let iovs: Vec<[IoSlice<'_>; 1]> = chunks[sent..sent + n]
                .iter()
                .map(|c| [IoSlice::new(c)])
                .collect();
            let msgs: Vec<OutMsg<'_>> = iovs
                .iter()
                .map(|iov| OutMsg {
                    addr: Some(&addr),
                    iov,
                    control: &cb.0[..clen],
                })
                .collect();
            let r = if self.caps.mmsg {
                sys::sendmmsg(&self.inner, &msgs, 0)
            } else {
                sys::sendmsg(&self.inner, &msgs[0], 0).map(|_| 1)
            };
            self.send_calls.fetch_add(1, Relaxed);
            match r {
                Ok(k) => {
                    sent += k;
                    self.send_messages.fetch_add(k as u64, Relaxed);
                    if let Some(cause) = ecn_refused.take() {
                        self.disable_ecn(&cause, &t.destination);
                    }
                }
                Err(e) => {
                    let errno = e.raw_os_error();
                    if matches!(errno, Some(libc::EIO) | Some(libc::EINVAL))
                        && t.ecn.is_some()
                        && self.ecn.load(Relaxed)
                        && ecn_refused.is_none()
                    {
                        ecn_refused = Some(e);
                        continue;
                    }
                    let transient =
                        e.kind() == io::ErrorKind::WouldBlock || errno == Some(libc::ENOBUFS);
                    if sent == 0 {
                        return Err(Error::Io(e));
                    }
                    let dl = *deadline.get_or_insert_with(|| Instant::now() + self.split_wait);
                    if !transient || Instant::now() >= dl {
                        return Err(Error::PartialTrain {
                            index: 0,
                            sent,
                            segments: total,
                            source: e,
                        });
                    }
                    if e.kind() == io::ErrorKind::WouldBlock {
                        let _ = sys::poll(
                            self.inner.as_raw_fd(),
                            sys::POLLOUT,
                            Duration::from_millis(100),
                        );
                    } else {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
        }
        Ok(())
    }

    /// Receives a batch of messages into `batch` and returns how many.
    ///
    /// Blocks (on a blocking socket) until at least one message is there,
    /// then takes what else is queued without waiting. With GRO, one message
    /// may hold many datagrams: see [`RecvMeta::datagrams`]. Truncated
    /// messages are flagged in their [`RecvMeta`] and counted in
    /// [`Stats::truncated`].
    pub fn recv(&self, batch: &mut RecvBatch) -> Result<usize, Error> {
        batch.len = 0;
        let stride = batch.stride;
        let got = if self.caps.mmsg {
            sys::recvmmsg(
                &self.inner,
                &mut batch.buf,
                stride,
                &mut batch.controls,
                &mut batch.raw,
                libc::MSG_WAITFORONE,
            )
        } else {
            sys::recvmsg(
                &self.inner,
                &mut batch.buf[..stride],
                &mut batch.controls[0],
                0,
            )
            .map(|m| {
                batch.raw[0] = m;
                1
            })
        }
        .map_err(Error::Io)?;
        self.recv_calls.fetch_add(1, Relaxed);
        self.recv_messages.fetch_add(got as u64, Relaxed);
        for i in 0..got {
            let raw: InMeta = batch.raw[i];
            let ctl =
                decode_recv(&batch.controls[i].0[..raw.control_len.min(batch.controls[i].0.len())]);
            let truncated = raw.flags & sys::MSG_TRUNC != 0;
            let control_truncated = raw.flags & sys::MSG_CTRUNC != 0 || ctl.is_err();
            let ctl = ctl.unwrap_or_default();
            if truncated {
                self.truncated.fetch_add(1, Relaxed);
            }
            if control_truncated {
                self.ctruncated.fetch_add(1, Relaxed);
            }
            if let Some(d) = ctl.drops {
                self.drops.fetch_max(d as u64, Relaxed);
            }
            let mut len = raw.len.min(stride);
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
        Ok(got)
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

/// Asks for `want` bytes with a FORCE option when the plain one was capped
/// (`got` below `want`); best effort, as it needs CAP_NET_ADMIN.
fn force_buffer(fd: RawFd, got: io::Result<usize>, want: usize, force: i32) {
    if got.unwrap_or(want) < want {
        let _ = sys::setsockopt_int(fd, SOL_SOCKET, force, want.min(i32::MAX as usize) as i32);
    }
}

fn is_v4_dest(d: &SocketAddr) -> bool {
    match d {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(v6) => v6.ip().to_ipv4_mapped().is_some(),
    }
}

/// Metadata of one received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// Default bytes per message: room for a 64-segment GRO train of 1500-byte
/// MTU datagrams (64 x 1472 = 94208), above the 65535 of one datagram.
pub const DEFAULT_MESSAGE_CAPACITY: usize = 96 * 1024;

/// Reusable receive buffers for [`Socket::recv`].
#[derive(Debug)]
pub struct RecvBatch {
    buf: Vec<u8>,
    stride: usize,
    controls: Vec<CmsgBuf>,
    raw: Vec<InMeta>,
    metas: Vec<RecvMeta>,
    len: usize,
}

impl RecvBatch {
    /// Buffers for `messages` messages of [`DEFAULT_MESSAGE_CAPACITY`] bytes.
    pub fn new(messages: usize) -> Self {
        Self::with_capacity(messages, DEFAULT_MESSAGE_CAPACITY)
    }

    /// Buffers for `messages` messages of `bytes_per_message` bytes each.
    /// A message larger than that is truncated, and reported as such.
    ///
    /// `bytes_per_message` is held to 1 byte .. 16 MiB. With GRO on, less
    /// than [`DEFAULT_MESSAGE_CAPACITY`] may truncate trains; a truncated
    /// train yields only its whole datagrams, and is flagged.
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
            raw: vec![InMeta::default(); messages],
            metas: vec![empty; messages],
            len: 0,
        }
    }

    /// Messages received by the last [`Socket::recv`].
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

    /// The messages received by the last [`Socket::recv`].
    pub fn iter(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> + '_ {
        (0..self.len).filter_map(move |i| self.get(i))
    }

    /// Every datagram of every message, with its message's metadata.
    pub fn datagrams(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> + '_ {
        self.iter()
            .flat_map(|(m, buf)| Datagrams::new(buf, m.stride).map(move |d| (m, d)))
    }
}

impl RecvMeta {
    /// Splits a message's payload into its datagrams.
    pub fn datagrams<'a>(&self, payload: &'a [u8]) -> Datagrams<'a> {
        Datagrams::new(payload, self.stride)
    }
}

/// Fault injection for unit tests: while switched on, a send that carries
/// an ECN mark fails with EINVAL instead of reaching the kernel, as on a
/// path that refuses ECN control messages.
#[cfg(test)]
mod faults {
    use std::cell::Cell;
    use std::io;

    thread_local! {
        static REFUSE_ECN: Cell<bool> = const { Cell::new(false) };
    }

    /// Refuse ECN-marked sends on this thread with EINVAL.
    pub fn refuse_ecn(on: bool) {
        REFUSE_ECN.with(|c| c.set(on));
    }

    /// The error to answer instead of making the syscall, if any.
    pub fn refused(has_ecn: bool) -> Option<io::Error> {
        (has_ecn && REFUSE_ECN.with(|c| c.get()))
            .then(|| io::Error::from_raw_os_error(libc::EINVAL))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn refused_ecn_mark_is_dropped_and_the_send_retried() {
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let dest = rx.local_addr().unwrap();
        let mut t = Transmit::new(dest, b"marked");
        t.ecn = Some(EcnCodepoint::Ect0);
        faults::refuse_ecn(true);
        let sent = tx.send(&[t, t]);
        faults::refuse_ecn(false);
        assert_eq!(sent.unwrap(), 2);
        assert!(!tx.ecn_enabled());
        let s = tx.stats();
        assert_eq!(s.fallbacks.len(), 1);
        assert_eq!(s.fallbacks[0].feature, Feature::Ecn);
        assert_eq!(s.fallbacks[0].errno, Some(libc::EINVAL));
        rx.as_std()
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut b = RecvBatch::new(4);
        let mut n = 0;
        while n < 2 {
            rx.recv(&mut b).unwrap();
            for (m, d) in b.datagrams() {
                assert_eq!(d, b"marked");
                assert_eq!(m.ecn, None, "sent without the refused mark");
                n += 1;
            }
        }
    }

    #[test]
    fn unknown_disable_name_is_a_clear_error() {
        let e = Disabled::parse("gso,gsoo").unwrap_err();
        assert!(e.contains("'gsoo'") && e.contains("known: gso, gro"), "{e}");
        let d = Disabled::parse(" GSO , ecn,").unwrap();
        assert!(d.gso && d.ecn && !d.gro);
    }

    #[test]
    fn disabled_features_are_off() {
        let c = Config {
            disabled: Disabled {
                gso: true,
                gro: true,
                mmsg: true,
                ecn: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let s = Socket::bind_with("127.0.0.1:0".parse().unwrap(), c).unwrap();
        let caps = s.capabilities();
        assert_eq!(caps.max_gso_segments, 1);
        assert!(!caps.gro && !caps.mmsg && !caps.ecn);
    }
}
