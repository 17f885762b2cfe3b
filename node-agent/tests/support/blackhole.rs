//! A TCP proxy on 127.0.0.1 that can make its connections go silently dead: on
//! [`BlackholeProxy::blackhole`], every connection open at that moment stops forwarding
//! in both directions but stays open (no RST, no FIN: the kernel still acknowledges
//! what arrives), as behind a NAT or load balancer that forgot the flow. Connections
//! opened afterwards are forwarded normally. Everything closes when the proxy drops.

use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Connections numbered below this one are dead.
    dead_below: AtomicU64,
    next_id: AtomicU64,
    /// Sockets of dead connections, kept open until the proxy drops.
    held: Mutex<Vec<TcpStream>>,
}

pub struct BlackholeProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl BlackholeProxy {
    pub fn start(upstream: SocketAddr) -> BlackholeProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared::default());
        let threads = Arc::new(Mutex::new(Vec::new()));
        let (s, t) = (shared.clone(), threads.clone());
        let accept = std::thread::spawn(move || {
            while !s.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
                            continue;
                        };
                        let id = s.next_id.fetch_add(1, Ordering::SeqCst);
                        let _ = client.set_nonblocking(false);
                        for (from, to) in [(client.try_clone(), server.try_clone()), (Ok(server), Ok(client))] {
                            if let (Ok(from), Ok(to)) = (from, to) {
                                let s = s.clone();
                                let pump = std::thread::spawn(move || pump(id, from, to, &s));
                                t.lock().unwrap_or_else(|p| p.into_inner()).push(pump);
                            }
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        threads.lock().unwrap_or_else(|p| p.into_inner()).push(accept);
        BlackholeProxy { addr, shared, threads }
    }

    /// Every connection open now goes silently dead; new ones still work.
    pub fn blackhole(&self) {
        let next = self.shared.next_id.load(Ordering::SeqCst);
        self.shared.dead_below.store(next, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.next_id.load(Ordering::SeqCst)
    }
}

/// Copies `from` → `to` until either side closes, the proxy stops, or the connection
/// is blackholed (then both sockets are kept open and nothing more is read).
fn pump(id: u64, mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if id < shared.dead_below.load(Ordering::SeqCst) {
            shared.held.lock().unwrap_or_else(|p| p.into_inner()).extend([from, to]);
            return;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if id < shared.dead_below.load(Ordering::SeqCst) {
                    continue; // dropped on the floor, as a dead path does
                }
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
        }
    }
}

impl Drop for BlackholeProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        self.shared.held.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
