//! An adapter that opens a network connection, so it imports `wasi:sockets`, which the
//! gateway never grants: it must be rejected at load.

wit_bindgen::generate!({ world: "plugin", path: "../../../wit/since_v0.1.0" });

use exports::rebound::adapter::adapter::Guest;
use rebound::adapter::types::{AdapterInfo, Classification, CompletedCall, Failure, Step};

struct Sockets;

impl Guest for Sockets {
    fn info() -> AdapterInfo {
        AdapterInfo { name: "sockets".into(), version: "0".into(), servers: vec![], tools: vec![] }
    }

    fn classify(_failure: Failure, _builtin: Classification) -> Option<Classification> {
        let _ = std::net::TcpStream::connect("127.0.0.1:9");
        None
    }

    fn plan(_failure: Failure, _class: Classification) -> Option<Vec<Step>> {
        None
    }

    fn observe(_call: CompletedCall) {}
}

export!(Sockets);
