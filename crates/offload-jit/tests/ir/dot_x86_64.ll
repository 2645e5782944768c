; Hand-written host kernel: a dot product loop the x86-64 backend vectorises.
source_filename = "dot_x86_64.ll"
target triple = "x86_64-unknown-linux-gnu"

define void @dot(ptr noalias %a, ptr noalias %b, ptr noalias %out, i64 %n) {
entry:
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i.next, %loop ]
  %acc = phi double [ 0.0, %entry ], [ %acc.next, %loop ]
  %pa = getelementptr double, ptr %a, i64 %i
  %pb = getelementptr double, ptr %b, i64 %i
  %va = load double, ptr %pa
  %vb = load double, ptr %pb
  %m = fmul double %va, %vb
  %acc.next = fadd double %acc, %m
  %i.next = add i64 %i, 1
  %more = icmp ult i64 %i.next, %n
  br i1 %more, label %loop, label %exit
exit:
  %r = phi double [ 0.0, %entry ], [ %acc.next, %loop ]
  store double %r, ptr %out
  ret void
}
