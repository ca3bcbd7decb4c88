//! An adapter that misbehaves on purpose, as `adapter_config.mode` says, whenever it is
//! asked to classify: it loops, eats memory, panics, floods its output, or reaches for
//! files and the environment it was not given. `plan` answers normally, so the tests
//! can tell a contained fault from a dead gateway.

wit_bindgen::generate!({ world: "plugin", path: "../../../wit/since_v0.1.0" });

use exports::rebound::adapter::adapter::Guest;
use rebound::adapter::host;
use rebound::adapter::types::{AdapterInfo, Classification, CompletedCall, Failure, Step};

struct Misbehave;

fn mode() -> String {
    let config = host::config();
    config.split('"').skip_while(|s| *s != "mode").nth(2).unwrap_or("none").to_owned()
}

impl Guest for Misbehave {
    fn info() -> AdapterInfo {
        AdapterInfo { name: "misbehave".into(), version: "0".into(), servers: vec![], tools: vec![] }
    }

    fn classify(_failure: Failure, builtin: Classification) -> Option<Classification> {
        match mode().as_str() {
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "memory" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "panic" => panic!("the adapter panicked on purpose"),
            "huge-output" => {
                let line = "x".repeat(1 << 10);
                for _ in 0..100_000 {
                    eprintln!("{line}");
                    println!("{line}");
                }
                None
            }
            "huge-answer" => Some(Classification { message: Some("y".repeat(64 << 20)), ..builtin }),
            "open-file" => {
                let opened = std::fs::read_to_string("/etc/passwd");
                eprintln!("open /etc/passwd: {opened:?}");
                let env: Vec<_> = std::env::vars().collect();
                eprintln!("environment: {env:?}");
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(u64::MAX);
                let msg = format!("file={} env={} clock={now}", opened.is_ok(), env.len());
                Some(Classification { message: Some(msg), ..builtin })
            }
            _ => None,
        }
    }

    fn plan(_failure: Failure, _class: Classification) -> Option<Vec<Step>> {
        None
    }

    fn observe(_call: CompletedCall) {}
}

export!(Misbehave);
