module criticalsvc.io/benchmarks/churn

go 1.24
