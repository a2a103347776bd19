//! Typed access to one JSON object of `config.json`, used only while parsing it.
//!
//! Sits between `serde_json::Value` and the resolved [`super::ModelConfig`]: every getter either
//! returns a value of the asked type or an `Error::Config` whose `field` is the full JSON path of
//! the key (`rope_scaling.factor`), so a refusal always names what to fix. A key that is present
//! with value `null` is treated exactly like an absent key.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// A JSON object plus the path prefix used to name its keys in errors (`""` or `"rope_scaling."`).
pub(crate) struct Obj<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Obj<'a> {
    pub(crate) fn new(map: &'a Map<String, Value>, prefix: &str) -> Self {
        Obj {
            map,
            prefix: prefix.to_string(),
        }
    }

    /// Full field name for error messages.
    pub(crate) fn field(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    pub(crate) fn err(&self, key: &str, msg: impl Into<String>) -> Error {
        Error::config(self.field(key), msg)
    }

    /// The value of `key`, `None` when absent or null.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Whether the key is written at all (even as `null`).
    pub(crate) fn has_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => as_usize(v).map(Some).ok_or_else(|| {
                self.err(key, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    pub(crate) fn req_usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(key, "required field is missing"))
    }

    /// Required and > 0.
    pub(crate) fn req_dim(&self, key: &str) -> Result<usize> {
        let v = self.req_usize(key)?;
        if v == 0 {
            return Err(self.err(key, "must be > 0"));
        }
        Ok(v)
    }

    pub(crate) fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        Ok(self.opt_usize(key)?.unwrap_or(default))
    }

    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.err(key, format!("expected a finite number, found {v}"))),
            },
        }
    }

    pub(crate) fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        Ok(self.opt_f64(key)?.unwrap_or(default))
    }

    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        Ok(self.opt_bool(key)?.unwrap_or(default))
    }

    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.err(key, format!("expected a string, found {v}"))),
        }
    }

    /// A nested object (`None` when absent or null).
    pub(crate) fn opt_obj(&self, key: &str) -> Result<Option<Obj<'a>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(Obj::new(m, &format!("{}{}.", self.prefix, key)))),
            Some(v) => Err(self.err(key, format!("expected an object, found {v}"))),
        }
    }

    /// Keys of the object (for refusing nested layouts we do not understand).
    pub(crate) fn values(&self) -> impl Iterator<Item = (&'a String, &'a Value)> {
        self.map.iter()
    }
}

/// A JSON number that is a non-negative integer (`4096` or `4096.0`).
pub(crate) fn as_usize(v: &Value) -> Option<usize> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).ok();
    }
    let f = v.as_f64()?;
    if f >= 0.0 && f.fract() == 0.0 && f < 9.0e15 {
        Some(f as usize)
    } else {
        None
    }
}
