//! Configuration errors: each names the file, the key and the fix.

use std::path::PathBuf;

/// The most of a key, a message or a hint an error shows.
const MAX_SHOWN: usize = 4096;

/// Why a configuration could not be used. Every variant's message names the file and,
/// where one is at fault, the dotted key path, and ends with a `hint:` line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}\nhint: pass the path of an existing JSON file to --config")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}:{line}:{column}: not valid JSON: {message}\nhint: fix the JSON at that line and column (trailing commas and comments are not allowed)"
    )]
    Syntax { path: PathBuf, line: usize, column: usize, message: String },
    /// Each part is shown as text from outside is (`crate::text::shown`): key names are
    /// the file's, and are quoted in the message and the hint too; one with a line break
    /// or a terminal escape in it would otherwise forge lines of the error, or drive the
    /// terminal that shows it.
    #[error(
        "{path}: `{key}`: {message}\nhint: {hint}",
        key = crate::text::shown(.key, MAX_SHOWN),
        message = crate::text::shown(.message, MAX_SHOWN),
        hint = crate::text::shown(.hint, MAX_SHOWN)
    )]
    Invalid { path: PathBuf, key: String, message: String, hint: String },
}

impl ConfigError {
    pub(crate) fn invalid(
        path: &std::path::Path,
        key: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Self::Invalid { path: path.to_path_buf(), key: key.into(), message: message.into(), hint: hint.into() }
    }

    /// The dotted key path at fault, if the error is about one key.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}
