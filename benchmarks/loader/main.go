// loader creates objects in a Kubernetes API server as fast as it accepts them: the population of
// benchmarks/realscale.py (10,000 namespaces and 100,000 objects), in Go because a Python client on this
// project's shared 2-core machine reaches only ~50-75 writes a second. Standard library only; it
// authenticates with a client certificate (the control plane's admin pair) and sends plain JSON.
//
//	loader -server https://127.0.0.1:PORT -ca ca.crt -cert admin.crt -key admin.key -workers 32 < objects.jsonl
//
// Each line of standard input is {"path": "/api/v1/namespaces/ns/configmaps", "body": {...}}: a POST of
// body to path. -workers goroutines send them. 201 counts as created, 409 (AlreadyExists) as existing;
// 429, 5xx and transport errors are retried (up to 8 times, backing off), and so is a pod refused because its
// namespace's default ServiceAccount is not made yet (for up to 2 minutes); anything else is an error. At the
// end it prints {"created": N, "existed": N, "errors": N, "retries": N, "seconds": S, "firstError": "..."}.
package main

import (
	"bufio"
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
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type item struct {
	Path string          `json:"path"`
	Body json.RawMessage `json:"body"`
}

func main() {
	server := flag.String("server", "", "API server URL")
	caFile := flag.String("ca", "", "CA certificate of the API server (PEM)")
	certFile := flag.String("cert", "", "client certificate (PEM)")
	keyFile := flag.String("key", "", "client key (PEM)")
	workers := flag.Int("workers", 32, "goroutines sending")
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
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}},
		MaxIdleConnsPerHost: *workers,
	}}

	var created, existed, errors, retries atomic.Int64
	var firstError atomic.Value
	fail := func(text string) {
		errors.Add(1)
		firstError.CompareAndSwap(nil, text)
	}
	send := func(it item) {
		for attempt := 0; ; attempt++ {
			req, _ := http.NewRequest("POST", *server+it.Path, bytes.NewReader(it.Body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			status, text := 0, ""
			if err == nil {
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				status, text = resp.StatusCode, string(data)
			} else {
				text = err.Error()
			}
			switch {
			case status == http.StatusCreated || status == http.StatusOK:
				created.Add(1)
				return
			case status == http.StatusConflict:
				existed.Add(1)
				return
			case (status == 0 || status == http.StatusTooManyRequests || status >= 500) && attempt < 8:
				retries.Add(1)
				time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
			case status == http.StatusForbidden && strings.Contains(text, "serviceaccount") && attempt < 120:
				// A pod in a namespace whose "default" ServiceAccount the controller has not made yet
				// (the ServiceAccount admission plugin refuses it until then): it comes.
				retries.Add(1)
				time.Sleep(time.Second)
			default:
				fail(fmt.Sprintf("POST %s: %d: %.300s", it.Path, status, text))
				return
			}
		}
	}

	items := make(chan item, 4**workers)
	var wg sync.WaitGroup
	started := time.Now()
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range items {
				send(it)
			}
		}()
	}
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 16<<20)
	for scanner.Scan() {
		line := scanner.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var it item
		if err := json.Unmarshal(line, &it); err != nil {
			fail(fmt.Sprintf("standard input: %v: %.200s", err, line))
			continue
		}
		items <- it
	}
	if err := scanner.Err(); err != nil {
		fail("standard input: " + err.Error())
	}
	close(items)
	wg.Wait()
	first, _ := firstError.Load().(string)
	out, _ := json.Marshal(map[string]any{"created": created.Load(), "existed": existed.Load(),
		"errors": errors.Load(), "retries": retries.Load(), "seconds": time.Since(started).Seconds(),
		"firstError": first})
	fmt.Println(string(out))
}
