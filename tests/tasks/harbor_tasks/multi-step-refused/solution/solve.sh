#!/bin/bash
echo hi > /app/hello.txt
