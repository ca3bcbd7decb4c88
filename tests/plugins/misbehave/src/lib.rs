//! An adapter that misbehaves on purpose, as `adapter_config.mode` says, whenever it is
//! asked to classify: it loops, eats memory, panics, floods its output, reaches for
//! files and the environment it was not given, looks for what an earlier call left in
//! its memory, or keeps each call's arguments in its store for the next (then `plan` keeps
//! them too). `plan` answers normally, so the tests
//! can tell a contained fault from a dead gateway.

wit_bindgen::generate!({ world: "plugin", path: "../../../wit/since_v0.1.0" });

use exports::rebound::adapter::adapter::Guest;
use rebound::adapter::host;
use rebound::adapter::types::{AdapterInfo, Classification, CompletedCall, Failure, Step};

struct Misbehave;

/// Calls this instance has served, in its data segment.
static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// Where the last call left its mark on the heap, in the zero-initialised segment.
static MARK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const SECRET: &[u8] = b"left behind by an earlier call";

fn mode() -> String {
    let config = host::config();
    config.split('"').skip_while(|s| *s != "mode").nth(2).unwrap_or("none").to_owned()
}

impl Guest for Misbehave {
    fn info() -> AdapterInfo {
        AdapterInfo { name: "misbehave".into(), version: "0".into(), servers: vec![], tools: vec![] }
    }

    fn classify(failure: Failure, builtin: Classification) -> Option<Classification> {
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
            "remember" => {
                use std::sync::atomic::Ordering::SeqCst;
                let calls = CALLS.fetch_add(1, SeqCst) + 1;
                // What the last call wrote to its heap, if that memory were still there.
                let at = MARK.load(SeqCst);
                let found = at != 0 && {
                    // SAFETY: `at` is within this instance's linear memory (any address
                    // below its size is), and reading bytes of it is all this does.
                    let left = unsafe { std::slice::from_raw_parts(at as *const u8, SECRET.len()) };
                    left == SECRET
                };
                let mark = Box::leak(SECRET.to_vec().into_boxed_slice());
                MARK.store(mark.as_ptr() as usize, SeqCst);
                Some(Classification { message: Some(format!("calls={calls} found={found}")), ..builtin })
            }
            "keep" => {
                // What the calls before left, from `classify` and from `plan`, and
                // whether this one's arguments are kept.
                let left = |key| rebound::adapter::store::get(key).unwrap_or_else(|| "nothing".into());
                let (seen, planned) = (left("last"), left("planned"));
                let kept = rebound::adapter::store::set("last", &failure.arguments);
                Some(Classification { message: Some(format!("seen {seen}; planned {planned}; kept={kept}")), ..builtin })
            }
            _ => None,
        }
    }

    fn plan(failure: Failure, _class: Classification) -> Option<Vec<Step>> {
        if mode() == "keep" {
            rebound::adapter::store::set("planned", &failure.arguments);
        }
        None
    }

    fn observe(_call: CompletedCall) {}
}

export!(Misbehave);
