//! An API server outage as one agent sees it: the agent reaches the test control plane
//! through a relay that the test cuts (every connection open is closed, every new one is
//! closed at once, as a stopped API server's port would) and restores. The control plane
//! itself runs on for the test binary's other tests; the relay stops when dropped,
//! however the test ends.

use std::{
    io,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use neuron_e2e::ControlPlane;

pub struct ApiRelay {
    /// A kubeconfig of the control plane's administrator, through the relay.
    pub kubeconfig: PathBuf,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    down: AtomicBool,
    stop: AtomicBool,
    /// Both ends of every relayed connection, to cut them.
    open: Mutex<Vec<TcpStream>>,
}

impl ApiRelay {
    /// Relays to `control_plane`'s API server; writes the kubeconfig in `dir`.
    pub fn start(control_plane: &ControlPlane, dir: &Path) -> ApiRelay {
        let upstream: SocketAddr = control_plane
            .server
            .strip_prefix("https://")
            .and_then(|a| a.parse().ok())
            .expect("the API server's address");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("relay address");
        // The serving certificate names 127.0.0.1: the relay's port changes nothing to it.
        let text = std::fs::read_to_string(&control_plane.kubeconfig).expect("the kubeconfig");
        let kubeconfig = dir.join("relayed.kubeconfig");
        std::fs::write(&kubeconfig, text.replace(&control_plane.server, &format!("https://{addr}")))
            .expect("write the kubeconfig");
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        std::thread::Builder::new()
            .name("api-relay".into())
            .spawn(move || accept(listener, upstream, &accepting))
            .expect("relay thread");
        ApiRelay { kubeconfig, shared }
    }

    /// The API server is down: open connections are cut, new ones closed at once.
    pub fn cut(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        for stream in self.shared.open.lock().expect("relay lock").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// The API server is back.
    pub fn restore(&self) {
        self.shared.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for ApiRelay {
    fn drop(&mut self) {
        self.cut();
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

fn accept(listener: TcpListener, upstream: SocketAddr, shared: &Shared) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) if shared.down.load(Ordering::SeqCst) => drop(client),
            Ok((client, _)) => {
                if let Err(e) = relay(client, upstream, shared) {
                    eprintln!("api relay → {upstream}: {e}");
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Copies `client` to a new connection to `upstream` and back, each way on a thread.
fn relay(client: TcpStream, upstream: SocketAddr, shared: &Shared) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect_timeout(&upstream, Duration::from_secs(5))?;
    shared.open.lock().expect("relay lock").extend([client.try_clone()?, server.try_clone()?]);
    if shared.down.load(Ordering::SeqCst) {
        // Cut while it was being made.
        let _ = (client.shutdown(Shutdown::Both), server.shutdown(Shutdown::Both));
    }
    for (mut from, mut into) in [(client.try_clone()?, server.try_clone()?), (server, client)] {
        std::thread::Builder::new().name("api-relay-copy".into()).spawn(move || {
            let _ = io::copy(&mut from, &mut into);
            let _ = into.shutdown(Shutdown::Write);
        })?;
    }
    Ok(())
}
