//! Binding the HTTP listener: `[::]` dual-stack, with an IPv4 fallback on
//! hosts without IPv6.

use std::net::{Ipv4Addr, SocketAddr};

use socket2::{Domain, Socket, Type};
use tracing::warn;

/// Binds `addr` for HTTP (a non-blocking std listener, for [`super::serve`] or
/// [`super::serve_on_own_thread`]). `[::]:port` listens on IPv6 and IPv4 alike
/// (IPV6_V6ONLY off, whatever the host's `net.ipv6.bindv6only`), so the
/// kubelet's probes reach it in IPv4, IPv6 and dual-stack pods; on a host
/// without IPv6 it falls back to `0.0.0.0:port`. Other addresses are bound
/// as given.
///
/// Errors: the bind error of `addr` (or of the IPv4 fallback).
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let dual = match addr {
        SocketAddr::V6(v6) if v6.ip().is_unspecified() => true,
        _ => return listen_on(addr, false),
    };
    match listen_on(addr, dual) {
        Err(err) if no_ipv6(&err) => {
            let fallback = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
            warn!(error = %err, addr = %fallback, "no IPv6 on this host; listening on IPv4 only");
            listen_on(fallback, false)
        }
        bound => bound,
    }
}

fn listen_on(addr: SocketAddr, dual_stack: bool) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    // As std and tokio do: a restarted sidecar must not wait out TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// The errors of a host or container without IPv6 (kernel `ipv6.disable=1`,
/// or no IPv6 address at all).
fn no_ipv6(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(nix::libc::EAFNOSUPPORT | nix::libc::EADDRNOTAVAIL | nix::libc::EPROTONOSUPPORT)
    )
}
