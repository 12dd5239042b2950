// churn writes to a Kubernetes API server at a steady rate until it is stopped: the background load
// of benchmarks/realcluster.py, in Go because a Python client on this project's shared 2-core machine
// reaches only ~50-75 writes a second. Standard library only; it authenticates with a client
// certificate (the control plane's admin pair) and sends plain JSON.
//
//	churn -server https://127.0.0.1:PORT -ca ca.crt -cert admin.crt -key admin.key \
//	      -namespace churn -prefix c8 -rate 300 -workers 20
//
// Each of -threads goroutines repeats, open loop at rate/threads: create a ConfigMap, merge-patch
// it, merge-patch the annotations of one of the -workers Deployments worker-0..N-1, delete the
// ConfigMap it created 200 cycles before (so the namespace holds a steady number). On SIGTERM or
// SIGINT it stops and prints {"writes": N, "errors": N, "seconds": S, "firstError": "..."}.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const keep = 200 // ConfigMaps each goroutine keeps before deleting its oldest

func main() {
	server := flag.String("server", "", "API server URL")
	caFile := flag.String("ca", "", "CA certificate of the API server (PEM)")
	certFile := flag.String("cert", "", "client certificate (PEM)")
	keyFile := flag.String("key", "", "client key (PEM)")
	namespace := flag.String("namespace", "churn", "namespace of the ConfigMaps and Deployments")
	prefix := flag.String("prefix", "churn", "prefix of the ConfigMaps' names (unique per run)")
	rate := flag.Float64("rate", 300, "writes per second, all goroutines together")
	threads := flag.Int("threads", 8, "goroutines writing")
	workers := flag.Int("workers", 20, "Deployments worker-0..N-1 whose annotations are patched")
	flag.Parse()

	ca, err := os.ReadFile(*caFile)
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}},
		MaxIdleConnsPerHost: *threads,
	}}

	var writes, errors atomic.Int64
	var firstError atomic.Value
	send := func(method, path, contentType string, body any) {
		var reader io.Reader
		if body != nil {
			data, _ := json.Marshal(body)
			reader = bytes.NewReader(data)
		}
		req, _ := http.NewRequest(method, *server+path, reader)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := client.Do(req)
		writes.Add(1)
		if err != nil {
			errors.Add(1)
			firstError.CompareAndSwap(nil, err.Error())
			return
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			errors.Add(1)
			firstError.CompareAndSwap(nil, fmt.Sprintf("%d: %.200s", resp.StatusCode, text))
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	started := time.Now()
	interval := time.Duration(float64(*threads) / *rate * float64(time.Second))
	cms := "/api/v1/namespaces/" + *namespace + "/configmaps"
	deployments := "/apis/apps/v1/namespaces/" + *namespace + "/deployments"
	for t := 0; t < *threads; t++ {
		wg.Add(1)
		go func(t int) {
			defer wg.Done()
			due := time.Now()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				n := k / 4
				name := fmt.Sprintf("%s-t%d-%d", *prefix, t, n)
				switch k % 4 {
				case 0:
					send("POST", cms, "application/json", map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
						"metadata": map[string]any{"name": name}, "data": map[string]string{"state": "idle"}})
				case 1:
					send("PATCH", cms+"/"+name, "application/merge-patch+json",
						map[string]any{"data": map[string]string{"state": "idle", "seen": fmt.Sprint(k)}})
				case 2:
					send("PATCH", fmt.Sprintf("%s/worker-%d", deployments, (t*7+n)%*workers), "application/merge-patch+json",
						map[string]any{"metadata": map[string]any{"annotations": map[string]string{"bench/churn": fmt.Sprint(k)}}})
				case 3:
					if n >= keep {
						send("DELETE", fmt.Sprintf("%s/%s-t%d-%d", cms, *prefix, t, n-keep), "", nil)
					}
				}
				due = due.Add(interval)
				if wait := time.Until(due); wait > 0 {
					select {
					case <-stop:
						return
					case <-time.After(wait):
					}
				} else if wait < -time.Second { // far behind: go on at full speed, do not burst to catch up
					due = time.Now()
				}
			}
		}(t)
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	close(stop)
	wg.Wait()
	first, _ := firstError.Load().(string)
	out, _ := json.Marshal(map[string]any{"writes": writes.Load(), "errors": errors.Load(),
		"seconds": time.Since(started).Seconds(), "firstError": first})
	fmt.Println(string(out))
}
