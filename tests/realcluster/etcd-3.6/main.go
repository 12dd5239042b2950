// Command etcd is the etcd server for criticalsvc's realcluster tests, built from the etcd server
// module (go.etcd.io/etcd/server/v3) rather than downloaded as a release binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
