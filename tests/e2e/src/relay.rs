//! A TCP relay from an address the real node's pods reach (its bridge, [`POD_GATEWAY`])
//! to a service the tests run on loopback (LocalStack listens on 127.0.0.1 only). Each
//! connection is copied both ways until either side closes; stopped on drop.
//!
//! [`POD_GATEWAY`]: crate::real_node::POD_GATEWAY

use std::{
    io,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::Context;

pub struct Relay {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Listens on `listen` and relays each connection to `to`.
    pub fn start(listen: SocketAddr, to: SocketAddr) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind(listen).with_context(|| format!("binding the relay on {listen}"))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new().name("relay".into()).spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if let Err(e) = relay(client, to) {
                            eprintln!("relay {addr} → {to}: {e}");
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        })?;
        Ok(Relay { addr, stop })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `client` to a new connection to `to` and back, each way on a thread of its own.
fn relay(client: TcpStream, to: SocketAddr) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let upstream = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
    let ways = [(client.try_clone()?, upstream.try_clone()?), (upstream, client)];
    for (mut from, mut into) in ways {
        std::thread::Builder::new().name("relay-copy".into()).spawn(move || {
            let _ = io::copy(&mut from, &mut into);
            let _ = into.shutdown(Shutdown::Write);
        })?;
    }
    Ok(())
}
