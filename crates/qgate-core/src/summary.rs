//! Mean, sample standard deviation and n: how every measured figure is reported, by the
//! clients (`qgate device`) and the lab alike.

/// Mean, sample standard deviation and count of a set of measurements.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1); 0 for n < 2.
    pub std: f64,
    /// Number of measurements.
    pub n: usize,
}

impl Summary {
    /// Summarise `xs`.
    pub fn of(xs: &[f64]) -> Summary {
        let n = xs.len();
        if n == 0 {
            return Summary {
                mean: f64::NAN,
                std: f64::NAN,
                n,
            };
        }
        let mean = xs.iter().sum::<f64>() / n as f64;
        let std = if n < 2 {
            0.0
        } else {
            (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        };
        Summary { mean, std, n }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = f.precision().unwrap_or(2);
        write!(f, "{:.p$} ± {:.p$} (n = {})", self.mean, self.std, self.n)
    }
}
