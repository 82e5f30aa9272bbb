package mcp

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/tool"
)

// TestListenTasks: ListenTasks holds a subscriptions/listen for task ids at
// a real upstream that offers tasks (the tasks fixture), reports what it
// agreed to and passes the notifications of the stream to its own
// callback alone, not to OnNotification (which serves every caller); it
// returns when its context ends.
func TestListenTasks(t *testing.T) {
	addr := testkit.FreeAddr(t)
	testkit.ServeFixture(t, testkit.TasksFixture, 15*time.Second, addr, "-http", addr)
	s := connect(t, Options{Name: "tk", URL: "http://" + addr + "/mcp", Timeout: 10 * time.Second})
	if !s.OffersTasks() {
		t.Fatal("the tasks fixture does not offer tasks through the source")
	}
	var mu sync.Mutex
	var shared []string
	s.OnNotification(func(method string, _ json.RawMessage) {
		mu.Lock()
		shared = append(shared, method)
		mu.Unlock()
	})
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Call(context.Background(), tool.Call{Tool: find(t, ds, "slow_compute"), Tasks: true,
		Input: json.RawMessage(`{"seconds":600,"label":"x"}`)})
	var task struct {
		TaskID string `json:"taskId"`
	}
	if err != nil || res.Task == nil || json.Unmarshal(res.Task, &task) != nil || task.TaskID == "" {
		t.Fatalf("a call declaring tasks: want a task, got %v %+v", err, res)
	}

	ctx, cancel := context.WithCancel(context.Background())
	acks := make(chan []string, 4)
	notices := make(chan json.RawMessage, 16)
	done := make(chan error, 1)
	go func() {
		done <- s.ListenTasks(ctx, []string{task.TaskID, "not-a-task"},
			func(agreed []string) { acks <- agreed },
			func(params json.RawMessage) { notices <- params })
	}()
	select {
	case agreed := <-acks:
		if !slices.Equal(agreed, []string{task.TaskID}) {
			t.Fatalf("the upstream agreed to %v, want only %s", agreed, task.TaskID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no acknowledgement within 20s")
	}
	if _, err := s.TaskRequest(context.Background(), "tasks/cancel", task.TaskID, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case params := <-notices:
		var n struct{ TaskID, Status string }
		if json.Unmarshal(params, &n) != nil || n.TaskID != task.TaskID || n.Status != "cancelled" {
			t.Fatalf("notification: %s", params)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no notification of the cancelled task within 20s")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ListenTasks after its context ended: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ListenTasks did not return after its context ended")
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(shared, "notifications/tasks") || slices.Contains(shared, "notifications/subscriptions/acknowledged") {
		t.Errorf("the task listen's messages reached OnNotification: %v", shared)
	}
}
