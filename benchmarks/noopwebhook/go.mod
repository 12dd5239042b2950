module criticalsvc.io/benchmarks/noopwebhook

go 1.24
