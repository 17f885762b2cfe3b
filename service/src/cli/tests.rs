use clap::{CommandFactory, FromArgMatches, Parser};

use super::*;

#[derive(Parser, Debug)]
struct Flags {
    #[command(flatten)]
    http: HttpFlags,
    #[command(flatten)]
    log: LogFlags,
}

const TEST: Flavor = Flavor {
    env_prefix: "NEURON_CLI_TEST",
    listen: "0.0.0.0:9999",
    max_connections: "7",
    max_connections_per_peer: "3",
};

fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
    let command = TEST.apply(Flags::command());
    command.try_get_matches_from(args).and_then(|m| Flags::from_arg_matches(&m))
}

#[test]
fn the_flavor_gives_the_defaults_and_every_shared_flag_its_variable() {
    TEST.apply(Flags::command()).debug_assert();
    let flags = parse(&["test"]).expect("defaults");
    assert_eq!(flags.http.listen, "0.0.0.0:9999".parse().unwrap());
    assert_eq!(flags.http.http_max_connections, 7);
    assert_eq!(flags.http.http_max_connections_per_peer, 3);
    assert_eq!(flags.http.http_header_timeout, Duration::from_secs(5));
    assert_eq!(flags.http.http_write_timeout, Duration::from_secs(10));
    assert_eq!((flags.http.http_max_unsent_bytes, flags.http.http_max_unsent_bytes_per_peer), (32 << 20, 8 << 20));
    assert_eq!(flags.http.http_send_buffer_bytes, 128 << 10);
    assert_eq!(flags.log.log, "info");
    assert!(flags.http.auth_options().is_none());

    let command = TEST.apply(Flags::command());
    for id in SHARED {
        let arg = command.get_arguments().find(|a| a.get_id() == id).expect(id);
        let env = arg.get_env().and_then(|e| e.to_str()).expect("an environment variable");
        assert_eq!(env, TEST.env_name(id));
    }
    assert_eq!(TEST.env_name("http_header_timeout"), "NEURON_CLI_TEST_HTTP_HEADER_TIMEOUT");
}

#[test]
fn flags_build_the_settings_and_keep_their_rules() {
    let flags = parse(&[
        "test",
        "--listen=127.0.0.1:1",
        "--http-header-timeout=200ms",
        "--http-max-connections-per-peer=2",
        "--http-write-timeout=3s",
        "--http-max-unsent-bytes=1048576",
        "--http-max-unsent-bytes-per-peer=65536",
        "--http-send-buffer-bytes=8192",
        "--tls-cert-file=c",
        "--tls-key-file=k",
        "--metrics-auth=true",
        "--metrics-auth-audiences=a,b",
    ])
    .expect("valid flags");
    let settings = flags.http.settings();
    assert_eq!(settings.listen, "127.0.0.1:1".parse().unwrap());
    assert_eq!(settings.limits.header_timeout, Duration::from_millis(200));
    assert_eq!((settings.limits.max_connections, settings.limits.max_connections_per_peer), (7, 2));
    assert_eq!(settings.limits.for_probes().max_connections_per_peer, 2, "the smaller of the two");
    assert_eq!(settings.limits.write_timeout, Duration::from_secs(3));
    assert_eq!((settings.limits.max_unsent_bytes, settings.limits.max_unsent_bytes_per_peer), (1 << 20, 64 << 10));
    assert_eq!(settings.limits.send_buffer_bytes, 8192);
    assert!(settings.tls.is_some());
    assert_eq!(flags.http.auth_options().expect("auth").audiences, ["a", "b"]);
    // Token checks need HTTPS; a certificate needs its key.
    assert!(parse(&["test", "--metrics-auth=true"]).is_err());
    assert!(parse(&["test", "--tls-cert-file=c"]).is_err());
    assert!(parse(&["test", "--http-max-connections=0"]).is_err());
    assert!(parse(&["test", "--http-max-connections-per-peer=0"]).is_err());
    assert!(parse(&["test", "--http-max-unsent-bytes=1000"]).is_err(), "below the least budget");
    // The token-free port needs its certificate and key, and they need it.
    assert!(parse(&["test", "--tokenless-listen=127.0.0.1:2"]).is_err());
    assert!(parse(&["test", "--tokenless-tls-cert-file=c", "--tokenless-tls-key-file=k"]).is_err());
    let tokenless =
        parse(&["test", "--tokenless-listen=127.0.0.1:2", "--tokenless-tls-cert-file=c", "--tokenless-tls-key-file=k"])
            .expect("the token-free port");
    let (addr, files) = tokenless.http.settings().tokenless.expect("a token-free port");
    assert_eq!(
        (addr, files.cert.as_path(), files.key.as_path()),
        ("127.0.0.1:2".parse().unwrap(), "c".as_ref(), "k".as_ref())
    );
    assert!(flags.http.settings().tokenless.is_none(), "none unless asked");
    assert!(parse(&["test", "--log-format=xml"]).is_err());
}

#[test]
fn durations_read_as_periods_do() {
    assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert!(parse_duration("5").is_err());
}
