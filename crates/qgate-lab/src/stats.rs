//! Summary statistics reported by experiments: mean, sample standard deviation, n; and
//! Welch's t-test for comparing two schemes (the Student t distribution from `statrs`).

use statrs::distribution::{ContinuousCDF, StudentsT};

pub use qgate_core::summary::Summary;

/// Welch's unequal-variances t-test of mean(b) − mean(a) (decision X5).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Welch {
    /// mean(b) − mean(a).
    pub diff: f64,
    /// 95 % confidence interval of the difference.
    pub ci95: (f64, f64),
    /// Two-sided p-value of "the means are equal".
    pub p: f64,
}

impl Welch {
    /// "p < 0.001", "p = 0.123", "no spread" (every value equal) or "too few" for a test's
    /// outcome, as the reports print it.
    pub fn p_label(w: Option<Welch>) -> String {
        match w {
            Some(w) if w.ci95.0 != w.ci95.1 && w.p < 0.001 => "p < 0.001".into(),
            Some(w) if w.ci95.0 != w.ci95.1 => format!("p = {:.3}", w.p),
            Some(_) => "no spread".into(),
            None => "too few".into(),
        }
    }

    /// Compare `b` with `a`; `None` with fewer than two values on either side.
    pub fn test(a: &[f64], b: &[f64]) -> Option<Welch> {
        let (sa, sb) = (Summary::of(a), Summary::of(b));
        if sa.n < 2 || sb.n < 2 {
            return None;
        }
        let diff = sb.mean - sa.mean;
        let (va, vb) = (sa.std.powi(2) / sa.n as f64, sb.std.powi(2) / sb.n as f64);
        let se2 = va + vb;
        if se2 == 0.0 {
            // Both sides constant: the difference is exact.
            let p = if diff == 0.0 { 1.0 } else { 0.0 };
            return Some(Welch {
                diff,
                ci95: (diff, diff),
                p,
            });
        }
        // Welch–Satterthwaite degrees of freedom.
        let df = se2.powi(2) / (va.powi(2) / (sa.n - 1) as f64 + vb.powi(2) / (sb.n - 1) as f64);
        let t = StudentsT::new(0.0, 1.0, df).ok()?;
        let se = se2.sqrt();
        let p = 2.0 * (1.0 - t.cdf((diff / se).abs()));
        let q = t.inverse_cdf(0.975);
        Some(Welch {
            diff,
            ci95: (diff - q * se, diff + q * se),
            p: p.clamp(0.0, 1.0),
        })
    }
}

/// Half-width of the 95 % confidence interval of the mean of `xs` (Student t); 0 for n < 2.
pub fn ci95_half(xs: &[f64]) -> f64 {
    let s = Summary::of(xs);
    if s.n < 2 {
        return 0.0;
    }
    StudentsT::new(0.0, 1.0, (s.n - 1) as f64)
        .map(|t| t.inverse_cdf(0.975) * s.std / (s.n as f64).sqrt())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welch_matches_a_known_case() {
        // Checked against SciPy 1.x: ttest_ind(b, a, equal_var=False) gives t = 2.5253,
        // df = 7.9744, p = 0.035600, 95 % CI [0.224499, 4.975501] for mean(b) − mean(a) = 2.6.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [3.0, 5.0, 6.0, 7.0, 7.0];
        let w = Welch::test(&a, &b).unwrap();
        assert!((w.diff - 2.6).abs() < 1e-12);
        assert!((w.p - 0.035600).abs() < 1e-5, "{w:?}");
        assert!((w.ci95.0 - 0.224499).abs() < 1e-5, "{w:?}");
        assert!((w.ci95.1 - 4.975501).abs() < 1e-5, "{w:?}");
        assert_eq!(Welch::test(&[1.0], &b), None);
        let same = Welch::test(&[2.0, 2.0], &[2.0, 2.0]).unwrap();
        assert_eq!((same.p, same.ci95), (1.0, (0.0, 0.0)));
        assert!((ci95_half(&[1.0, 2.0, 3.0]) - 2.484).abs() < 1e-3);
    }

    #[test]
    fn mean_and_sample_std() {
        let s = Summary::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.mean, 5.0);
        assert!((s.std - 2.138_089_935).abs() < 1e-6);
        assert_eq!(format!("{s:.1}"), "5.0 ± 2.1 (n = 8)");
        assert_eq!(Summary::of(&[3.0]).std, 0.0);
    }
}
