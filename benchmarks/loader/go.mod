module criticalsvc.io/benchmarks/loader

go 1.24
