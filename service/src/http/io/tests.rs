use std::{net::IpAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::Semaphore,
};

use super::*;
use crate::http::{
    connection::Seat,
    peers::Peers,
    unsent::{Unsent, UnsentLimits},
    Port,
};

const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

fn connection() -> Arc<Connection> {
    let ip: IpAddr = "127.0.0.2".parse().unwrap();
    let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
    Connection::new(Port::Main, ip, Seat { permit, slot: Peers::new(1).try_take(ip).unwrap() })
}

#[tokio::test(start_paused = true)]
async fn a_response_is_released_once_written_and_closed_when_left_unread_past_the_deadline() {
    let unsent = Unsent::new(UnsentLimits { max_bytes: 1 << 20, max_bytes_per_peer: 1 << 20 }, Default::default());
    let connection = connection();
    // A socket whose buffers hold 1 KiB.
    let (mut client, server) = tokio::io::duplex(1024);
    let mut stream = Watched::new(server, connection.clone(), unsent.clone(), WRITE_TIMEOUT);

    assert!(unsent.charge(&connection, 100));
    stream.write_all(&[b'a'; 100]).await.unwrap();
    stream.flush().await.unwrap();
    assert_eq!(unsent.total(), 0, "written whole: no longer unsent");
    client.read_exact(&mut [0; 100]).await.unwrap();

    // The time taken to produce the next response does not count.
    tokio::time::sleep(WRITE_TIMEOUT * 3).await;
    assert!(unsent.charge(&connection, 100));
    stream.write_all(&[b'b'; 100]).await.unwrap();
    stream.flush().await.unwrap();
    assert_eq!(unsent.total(), 0);

    // 4 KiB to a client that does not read.
    assert!(unsent.charge(&connection, 4096));
    let started = tokio::time::Instant::now();
    let error = stream.write_all(&[b'c'; 4096]).await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    assert_eq!(started.elapsed(), WRITE_TIMEOUT, "at the deadline, not before");
    assert!(connection.write_timed_out());
    assert_eq!(unsent.total(), 4096, "released when the connection ends");
    drop(client);
}

#[tokio::test]
async fn a_socket_stays_vectored_so_that_hyper_queues_a_page_without_copying_it() {
    let unsent = Unsent::new(UnsentLimits { max_bytes: 1 << 20, max_bytes_per_peer: 1 << 20 }, Default::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    assert!(Watched::new(server, connection(), unsent, WRITE_TIMEOUT).is_write_vectored());
}
