//! An adapter built against a contract version the gateway does not speak.

wit_bindgen::generate!({ world: "plugin", path: "wit" });

struct Future;

impl exports::rebound::adapter::adapter::Guest for Future {
    fn info() -> String {
        "from the future".into()
    }
}

export!(Future);
