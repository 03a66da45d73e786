//! [`FaultProxy`]: a TCP proxy on a free loopback port between snowlease and one Redis, whose
//! connections tests can black-hole, delay, cut in one direction or reset, all at once or one
//! by one. Bytes held by a fault are delivered, in order, once the connection passes again.
//!
//! Threads: one accepts; each connection has a reader and a writer per direction. Readers
//! queue what they read (with its arrival time); writers forward the queue when the
//! connection's [`Mode`] lets them. All state sits behind one mutex; each connection has its
//! own condvar, so a chunk wakes only the writers of its connection.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::{RedisServer, free_port, ms, poll_until, secs};

/// What a connection does with the bytes it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward both directions at once.
    Pass,
    /// Keep the connection open but forward nothing; bytes are held until the mode changes.
    Blackhole,
    /// Forward each chunk `up` (client -> Redis) / `down` (Redis -> client) after it arrived
    /// at the proxy; order is kept.
    Delay { up: Duration, down: Duration },
    /// Forward client -> Redis; discard Redis -> client bytes (replies are lost on the wire).
    DropReplies,
    /// Close the connection with RST on both sides (SO_LINGER 0). As the proxy-wide mode, new
    /// connections are reset as soon as they are accepted.
    Reset,
}

impl Mode {
    /// Both directions delayed by `delay`.
    pub fn delay(delay: Duration) -> Mode {
        Mode::Delay {
            up: delay,
            down: delay,
        }
    }
}

/// One proxied connection as a test sees it.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// 0, 1, 2... in accept order.
    pub id: usize,
    /// The client's address (its local port identifies the client socket).
    pub peer: SocketAddr,
    /// False once both directions ended (each side closed, the close delivered), or it was
    /// reset, or the proxy stopped. A close is held like bytes under [`Mode::Blackhole`].
    pub open: bool,
    /// The mode it follows now (its own, or the proxy-wide one).
    pub mode: Mode,
    /// Bytes read from the client / Redis and not yet forwarded (held or delayed).
    pub queued_up: usize,
    pub queued_down: usize,
    /// Bytes written to Redis / to the client so far.
    pub forwarded_up: usize,
    pub forwarded_down: usize,
    /// Bytes from Redis thrown away under [`Mode::DropReplies`].
    pub dropped_down: usize,
}

/// A TCP proxy on `127.0.0.1:<free port>` in front of one Redis; stopped on drop (every
/// connection closed), its event log printed when the test panics. To fault one sidecar among
/// several, give each sidecar its own proxy (a proxy costs one thread plus four per
/// connection).
///
/// ```ignore
/// let redis = RedisServer::start();
/// let proxy = FaultProxy::for_redis(&redis);
/// let sidecar = Sidecar::worker_at(&proxy.url(), "orders").spawn();
/// proxy.freeze_existing();          // old connections hang, new ones work
/// proxy.set_mode(Mode::Pass);       // held bytes are delivered now
/// ```
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    stopping: AtomicBool,
    started: Instant,
}

struct State {
    upstream: SocketAddr,
    mode: Mode,
    conns: Vec<Conn>,
    events: Vec<String>,
}

struct Conn {
    peer: SocketAddr,
    /// Own mode; None follows the proxy-wide mode.
    mode: Option<Mode>,
    closed: bool,
    /// Handles kept to shut the sockets down; dropped when the connection closes.
    client: Option<TcpStream>,
    server: Option<TcpStream>,
    up: Pipe,
    down: Pipe,
    /// Notified when its queues, its mode or the proxy-wide mode change.
    wake: Arc<Condvar>,
}

#[derive(Default)]
struct Pipe {
    queue: VecDeque<Chunk>,
    forwarded: usize,
    dropped: usize,
    /// The writer has passed the end of stream on (shutdown sent) or stopped.
    done: bool,
}

struct Chunk {
    arrived: Instant,
    /// Empty: the end of stream (the reader saw EOF or an error).
    bytes: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Up,
    Down,
}

impl FaultProxy {
    /// A proxy in front of `upstream`, in [`Mode::Pass`].
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let (port, listener) = bind_free_port();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                upstream,
                mode: Mode::Pass,
                conns: Vec::new(),
                events: Vec::new(),
            }),
            stopping: AtomicBool::new(false),
            started: Instant::now(),
        });
        let accept = {
            let shared = shared.clone();
            thread::spawn(move || accept_loop(listener, shared))
        };
        shared.event(format!("listening on :{port}, upstream {upstream}"));
        FaultProxy {
            port,
            shared,
            accept: Some(accept),
        }
    }

    /// A proxy in front of `redis`.
    pub fn for_redis(redis: &RedisServer) -> FaultProxy {
        FaultProxy::start(loopback(redis.port()))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Connections accepted from now on go to `upstream` (open ones keep theirs).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        self.shared.lock().upstream = upstream;
        self.shared.event(format!("upstream -> {upstream}"));
    }

    /// Sets the proxy-wide mode, for every open connection (their own modes are cleared) and
    /// for new ones. Leaving a holding mode delivers what was held, in order.
    pub fn set_mode(&self, mode: Mode) {
        let mut st = self.shared.lock();
        st.mode = mode;
        for c in st.conns.iter_mut().filter(|c| !c.closed) {
            c.mode = None;
            if mode == Mode::Reset {
                c.reset();
            }
        }
        drop(st);
        self.shared.event(format!("all connections -> {mode:?}"));
        self.shared.wake_all();
    }

    /// Sets the mode of connection `id` only (see [`FaultProxy::connections`]).
    pub fn set_conn_mode(&self, id: usize, mode: Mode) {
        let mut st = self.shared.lock();
        let conn = st
            .conns
            .get_mut(id)
            .unwrap_or_else(|| panic!("no proxy connection {id}"));
        conn.mode = Some(mode);
        if mode == Mode::Reset {
            conn.reset();
        }
        drop(st);
        self.shared.event(format!("connection {id} -> {mode:?}"));
        self.shared.wake_all();
    }

    /// Shorthand for `set_mode(Mode::Pass)`: everything passes, held bytes are delivered.
    pub fn release(&self) {
        self.set_mode(Mode::Pass);
    }

    /// Black-holes every open connection while new connections pass: a conntrack or NAT entry
    /// pointing at a dead pod, with the service itself reachable.
    pub fn freeze_existing(&self) {
        let mut st = self.shared.lock();
        st.mode = Mode::Pass;
        let mut frozen = Vec::new();
        for (id, c) in st.conns.iter_mut().enumerate().filter(|(_, c)| !c.closed) {
            c.mode = Some(Mode::Blackhole);
            frozen.push(id);
        }
        drop(st);
        self.shared
            .event(format!("froze connections {frozen:?}; new ones pass"));
        self.shared.wake_all();
    }

    /// Every connection accepted so far, in accept order.
    pub fn connections(&self) -> Vec<ConnInfo> {
        let st = self.shared.lock();
        st.conns
            .iter()
            .enumerate()
            .map(|(id, c)| ConnInfo {
                id,
                peer: c.peer,
                open: !c.closed,
                mode: c.mode.unwrap_or(st.mode),
                queued_up: c.up.queued(),
                queued_down: c.down.queued(),
                forwarded_up: c.up.forwarded,
                forwarded_down: c.down.forwarded,
                dropped_down: c.down.dropped,
            })
            .collect()
    }

    /// The open connections.
    pub fn open_connections(&self) -> Vec<ConnInfo> {
        self.connections().into_iter().filter(|c| c.open).collect()
    }

    /// Waits (up to `timeout`) until at least `n` client -> Redis bytes are held in the proxy
    /// on one connection; returns that connection. E.g. "the renew is queued in the proxy".
    pub fn wait_queued_up(&self, n: usize, timeout: Duration) -> Option<ConnInfo> {
        super::poll_some(timeout, || {
            self.connections()
                .into_iter()
                .find(|c| c.open && c.queued_up >= n)
        })
    }

    /// The proxy's event log (accepts, closes, mode changes), with ms since start.
    pub fn events(&self) -> Vec<String> {
        self.shared.lock().events.clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let _ = TcpStream::connect_timeout(&loopback(self.port), ms(500));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for c in self.shared.lock().conns.iter_mut() {
            c.close();
        }
        self.shared.wake_all();
        if thread::panicking() {
            eprintln!(
                "===== fault proxy :{} events =====\n{}",
                self.port,
                self.events().join("\n")
            );
        }
    }
}

impl Shared {
    /// Wakes every connection's writers (after a mode change).
    fn wake_all(&self) {
        for c in &self.lock().conns {
            c.wake.notify_all();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn event(&self, what: String) {
        let at = self.started.elapsed().as_millis();
        self.lock().events.push(format!("{at:>6} ms {what}"));
    }
}

impl Pipe {
    fn queued(&self) -> usize {
        self.queue.iter().map(|c| c.bytes.len()).sum()
    }
}

impl Conn {
    fn pipe(&mut self, dir: Dir) -> &mut Pipe {
        match dir {
            Dir::Up => &mut self.up,
            Dir::Down => &mut self.down,
        }
    }

    /// Marks the connection closed and wakes its readers; the sockets close (FIN) once every
    /// thread has let go of them.
    fn close(&mut self) {
        self.closed = true;
        self.wake.notify_all();
        for s in [self.client.take(), self.server.take()]
            .into_iter()
            .flatten()
        {
            // Read side only: wakes a blocked reader without sending anything to the peer.
            let _ = s.shutdown(Shutdown::Read);
        }
    }

    /// Like close, but the last close of each socket sends RST (SO_LINGER 0).
    fn reset(&mut self) {
        for s in [&self.client, &self.server].into_iter().flatten() {
            let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
        }
        self.close();
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn bind_free_port() -> (u16, TcpListener) {
    for _ in 0..20 {
        let port = free_port();
        if let Ok(l) = TcpListener::bind(loopback(port)) {
            return (port, l);
        }
    }
    panic!("fault proxy: no free loopback port");
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let _ = client.set_nodelay(true);
        // A writer waiting on a full buffer looks at the closed flag this often.
        let _ = client.set_write_timeout(Some(secs(1)));
        let Ok(peer) = client.peer_addr() else {
            continue;
        };
        let (id, reset) = register(&shared, client.try_clone().expect("clone socket"), peer);
        shared.event(format!("accepted connection {id} from {peer}"));
        if reset {
            shared.lock().conns[id].reset();
            shared.event(format!("connection {id} reset on accept"));
            continue;
        }
        spawn_pump(
            &shared,
            id,
            Dir::Up,
            client.try_clone().expect("clone socket"),
        );
        spawn_forwarder(&shared, id, Dir::Down, Some(client));
        // The Up writer connects to the upstream itself, on its first forward.
        spawn_forwarder(&shared, id, Dir::Up, None);
    }
}

fn register(shared: &Shared, client: TcpStream, peer: SocketAddr) -> (usize, bool) {
    let mut st = shared.lock();
    st.conns.push(Conn {
        peer,
        mode: None,
        closed: false,
        client: Some(client),
        server: None,
        up: Pipe::default(),
        down: Pipe::default(),
        wake: Arc::new(Condvar::new()),
    });
    (st.conns.len() - 1, st.mode == Mode::Reset)
}

/// Reads `from` into the queue of `dir` until EOF or an error, then queues the end of stream.
fn spawn_pump(shared: &Arc<Shared>, id: usize, dir: Dir, mut from: TcpStream) {
    let shared = shared.clone();
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            let mut st = shared.lock();
            if st.conns[id].closed {
                return;
            }
            st.conns[id].pipe(dir).queue.push_back(Chunk {
                arrived: Instant::now(),
                bytes: buf[..n].to_vec(),
            });
            st.conns[id].wake.notify_all();
            drop(st);
            if n == 0 {
                return;
            }
        }
    });
}

/// Forwards the queue of `dir` as the connection's mode allows. `to` is the client for Down;
/// for Up it is None and the upstream is connected on the first forward.
fn spawn_forwarder(shared: &Arc<Shared>, id: usize, dir: Dir, to: Option<TcpStream>) {
    let shared = shared.clone();
    thread::spawn(move || {
        let mut to = to;
        while let Some(chunk) = next_chunk(&shared, id, dir) {
            if to.is_none() && chunk.bytes.is_empty() {
                // The client left before sending anything: no upstream connection needed.
                shared.lock().conns[id].close();
                return;
            }
            if to.is_none() {
                to = connect_upstream(&shared, id);
                if to.is_none() {
                    return;
                }
            }
            let out = to.as_mut().expect("connected");
            let ok = if chunk.bytes.is_empty() {
                let _ = out.shutdown(Shutdown::Write);
                false
            } else {
                write_chunk(&shared, id, out, &chunk.bytes)
            };
            let mut st = shared.lock();
            let conn = &mut st.conns[id];
            conn.pipe(dir).forwarded += chunk.bytes.len();
            if !ok {
                conn.pipe(dir).done = true;
                // Both directions ended: the connection is over.
                if conn.up.done && conn.down.done {
                    conn.close();
                }
                return;
            }
        }
    });
}

/// Writes all of `bytes`, waiting as long as the peer does not read (e.g. a SIGSTOPped
/// client) unless the connection closes meanwhile. False on a write error or a close.
fn write_chunk(shared: &Shared, id: usize, out: &mut TcpStream, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        match out.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            // The write timeout only lets us look at the closed flag now and then.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if shared.lock().conns[id].closed {
                    return false;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// Waits for the next chunk of `dir` that the mode lets through; None once the connection is
/// closed. Chunks discarded by DropReplies are counted and skipped here.
fn next_chunk(shared: &Shared, id: usize, dir: Dir) -> Option<Chunk> {
    let mut st = shared.lock();
    loop {
        let global = st.mode;
        let conn = &mut st.conns[id];
        if conn.closed {
            return None;
        }
        let mode = conn.mode.unwrap_or(global);
        let pipe = conn.pipe(dir);
        let mut wait = secs(1);
        if let Some(head) = pipe.queue.front() {
            let delay = match (mode, dir) {
                (Mode::Blackhole | Mode::Reset, _) => None,
                (Mode::Delay { up, .. }, Dir::Up) => Some(up),
                (Mode::Delay { down, .. }, Dir::Down) => Some(down),
                _ => Some(Duration::ZERO),
            };
            if let Some(delay) = delay {
                let due = head.arrived + delay;
                let now = Instant::now();
                if due <= now {
                    let chunk = pipe.queue.pop_front().expect("head");
                    if mode == Mode::DropReplies && dir == Dir::Down && !chunk.bytes.is_empty() {
                        pipe.dropped += chunk.bytes.len();
                        continue;
                    }
                    return Some(chunk);
                }
                wait = due - now;
            }
        }
        let wake = conn.wake.clone();
        st = wake
            .wait_timeout(st, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Connects connection `id` to the current upstream and starts its Down reader; on failure
/// resets the client (as a refused connection would end) and returns None.
fn connect_upstream(shared: &Arc<Shared>, id: usize) -> Option<TcpStream> {
    let upstream = shared.lock().upstream;
    match TcpStream::connect_timeout(&upstream, secs(2)) {
        Ok(server) => {
            let _ = server.set_nodelay(true);
            let _ = server.set_write_timeout(Some(secs(1)));
            let mut st = shared.lock();
            if st.conns[id].closed {
                return None;
            }
            st.conns[id].server = Some(server.try_clone().expect("clone socket"));
            drop(st);
            spawn_pump(
                shared,
                id,
                Dir::Down,
                server.try_clone().expect("clone socket"),
            );
            Some(server)
        }
        Err(e) => {
            shared.lock().conns[id].reset();
            shared.event(format!("connection {id}: upstream {upstream}: {e}; reset"));
            None
        }
    }
}

/// True when a plain client can reach Redis through `proxy` within `timeout` (PING answered).
pub fn proxy_answers(proxy: &FaultProxy, timeout: Duration) -> bool {
    poll_until(timeout, || super::redis_server::ping(&proxy.url()))
}
