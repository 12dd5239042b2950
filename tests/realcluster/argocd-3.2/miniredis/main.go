// A Redis for the realcluster tests' Argo CD (its application controller and repo-server keep their
// cache there): miniredis, the in-memory Redis Argo CD's own tests start
// (https://github.com/argoproj/argo-cd/blob/v3.2.3/util/cache/redis_test.go), served on the address
// given. Prints "listening on ADDR" once it accepts connections; runs until killed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/alicebob/miniredis/v2"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "the address to listen on")
	flag.Parse()
	server := miniredis.NewMiniRedis()
	if err := server.StartAddr(*addr); err != nil {
		fmt.Fprintf(os.Stderr, "miniredis: cannot listen on %s: %v\n", *addr, err)
		os.Exit(1)
	}
	fmt.Printf("listening on %s\n", server.Addr())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	server.Close()
}
