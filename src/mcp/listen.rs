//! Where the server listens: the configured port or, when that is taken and the port is not strict, the next
//! free one (the next few ports first, so a second copy of a game lands somewhere predictable, then any).

use std::io::ErrorKind;
use std::net::{IpAddr, TcpListener};

use super::security::McpConfigError;
use super::McpConfigErrorKind::Listen;

/// How many ports after a taken one are tried before letting the system pick.
const NEXT_PORTS: u16 = 9;

/// A bound listener, and the configured port when it could not be bound and another serves instead.
pub(crate) struct Listening {
    pub listener: TcpListener,
    pub replaced: Option<Replaced>,
}

/// The configured port, and why it could not be bound.
pub(crate) struct Replaced {
    pub port: u16,
    pub why: std::io::Error,
}

/// Binds `address:port`. A port another program holds (or one this user may not bind, as Windows reserves ranges
/// for Hyper-V) is replaced, unless `strict`, by `port + 1 ..= port + 9`, then by any free port.
pub(crate) fn listen(address: IpAddr, port: u16, strict: bool) -> Result<Listening, McpConfigError> {
    let refused = match TcpListener::bind((address, port)) {
        Ok(listener) => return Ok(Listening { listener, replaced: None }),
        Err(error) => error,
    };
    let movable = matches!(refused.kind(), ErrorKind::AddrInUse | ErrorKind::PermissionDenied);
    if !movable || port == 0 || strict {
        return Err(McpConfigError::new(Listen, format!("could not listen on {address}:{port}: {refused}")));
    }
    let next = (1..=NEXT_PORTS).filter_map(|step| port.checked_add(step));
    for candidate in next.chain([0]) {
        if let Ok(listener) = TcpListener::bind((address, candidate)) {
            return Ok(Listening { listener, replaced: Some(Replaced { port, why: refused }) });
        }
    }
    Err(McpConfigError::new(
        Listen,
        format!("could not listen on {address}:{port} ({refused}), nor on any other port of that address"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn a_taken_port_moves_to_the_next_free_one_unless_strict() {
        let taken = TcpListener::bind((LOOPBACK, 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        match listen(LOOPBACK, port, false) {
            Ok(Listening { listener, replaced }) => {
                let moved = listener.local_addr().unwrap().port();
                assert_eq!(
                    replaced.map(|replaced| (replaced.port, replaced.why.kind())),
                    Some((port, ErrorKind::AddrInUse))
                );
                assert_ne!(moved, port);
            }
            Err(error) => panic!("{error}"),
        }
        let strict = listen(LOOPBACK, port, true).err().expect("strict: refused");
        assert!(strict.message().contains(&format!(":{port}:")), "{strict}");
    }

    #[test]
    fn the_next_ports_come_before_any_port() {
        // Hold a port and find one whose successor is free; the move lands on the successor.
        for _ in 0..20 {
            let taken = TcpListener::bind((LOOPBACK, 0)).unwrap();
            let port = taken.local_addr().unwrap().port();
            let Some(next) = port.checked_add(1) else { continue };
            let Ok(probe) = TcpListener::bind((LOOPBACK, next)) else { continue };
            drop(probe);
            let moved = listen(LOOPBACK, port, false).unwrap().listener.local_addr().unwrap().port();
            // Another process may take `next` between the probe and the move: then any later port will do.
            if moved == next {
                return;
            }
        }
        panic!("the move never landed on the next port in 20 tries");
    }

    #[test]
    fn port_zero_and_other_errors_are_not_moved() {
        assert!(listen(LOOPBACK, 0, false).unwrap().replaced.is_none());
        // An address this machine does not have: not a taken port, so no move (and the error names it).
        let foreign: IpAddr = "192.0.2.1".parse().unwrap();
        let error = listen(foreign, 15777, false).err().expect("not this machine's address");
        assert!(error.message().contains("192.0.2.1:15777"), "{error}");
    }
}
